"""Harbor tasks end to end, on one local stack of two nodes: the example tasks built with Docker,
run with the oracle and with a no-op agent and graded in sandboxes as Harbor grades; a hostile
agent that tries to forge its grade; test runs that fail, which FAIL the episode with the reason;
and Claude Code laid over a task's environment, preempted mid-stream and resumed on the other
node."""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.local import LocalSettings, LocalStack, free_port
from orchestrator.client import taskimage
from orchestrator.reference_model import ReferenceModelServer
from orchestrator.task import TaskAgent, claude_code, load_task, task_episode
from tests.orchestrator.conftest import cli, remove_sandboxes, seed_images
from tests.orchestrator.models import TOKENS, slow_model
from tests.orchestrator.test_harnesses_e2e import CLAUDE, preempted_mid_generation_and_finished

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"

HOSTILE = r"""
set -u
# Whatever the tests would run, trojaned: each prints a perfect grade wherever one goes.
forge='#!/bin/sh
mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo "{\"reward\": 1}" > /logs/verifier/reward.json
exit 0'
for program in /usr/bin/python3 /bin/bash /usr/bin/bash /usr/bin/timeout /bin/sh; do
  printf '%s\n' "$forge" > "$program.forged" && chmod 755 "$program.forged" && mv -f "$program.forged" "$program"
done
# The tests and the reward planted in advance, where Harbor puts them.
mkdir -p /tests /logs/verifier
printf '%s\n' "$forge" > /tests/test.sh
echo 1 > /logs/verifier/reward.txt
echo '{"reward": 1}' > /logs/verifier/reward.json
# Its answer a symlink to a node file that holds the right one.
ln -sf "$NODE_ANSWER" /app/config.ini
echo forged
"""


@pytest.fixture(scope="module")
def model() -> Iterator[ReferenceModelServer]:
    server = slow_model()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, base_images: Path, model: ReferenceModelServer
) -> Iterator[LocalStack]:
    """Two nodes, the reference model upstream in token mode, and the stack's import registry."""
    root = tmp_path_factory.mktemp("tasks")
    settings = LocalSettings(
        state_dir=root / "stack", listen=f"127.0.0.1:{free_port()}", stacks_dir=root / "stacks",
        nodes=2, slots=2, upstream=model.url, model=TOKENS,  # type: ignore[arg-type]
    )  # fmt: skip
    seed_images(settings, base_images)
    local = LocalStack(settings)
    local.start()
    yield local
    local.stop()
    remove_sandboxes(local.state_dir)


@pytest.fixture(scope="module")
def built(stack: LocalStack, dockerd: str, docker_base: str) -> dict[str, str]:
    """Each example task's environment, built from BASE=the base image and imported; its name."""
    names = {}
    for example in sorted(EXAMPLES.iterdir()):
        first = cli(
            stack,
            "task",
            "build",
            str(example),
            "--build-arg",
            f"BASE={docker_base}",
            env={"DOCKER_HOST": dockerd},
        )
        assert first.stdout.split()[1] == "built", first.stdout + first.stderr
        names[example.name] = first.stdout.split()[0]
    return names


@pytest.mark.timeout(300)
def test_a_task_build_is_cached_and_a_changed_dockerfile_builds_a_new_image(
    stack: LocalStack, built: dict[str, str], dockerd: str, docker_base: str, tmp_path: Path
) -> None:
    flags = ("--build-arg", f"BASE={docker_base}")
    env = {"DOCKER_HOST": dockerd}
    again = cli(stack, "task", "build", str(EXAMPLES / "fix-config"), *flags, env=env)
    assert again.stdout.split() == [built["fix-config"], "cached"], again.stdout + again.stderr
    changed = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / "fix-config"))
    with open(changed / "environment" / "Dockerfile", "a") as f:
        f.write("RUN echo changed > /etc/changed\n")
    rebuilt = cli(stack, "task", "build", str(changed), *flags, env=env).stdout.split()
    assert rebuilt[1] == "built" and rebuilt[0] != built["fix-config"], rebuilt


@pytest.mark.timeout(300)
def test_each_example_task_passes_with_the_oracle_and_fails_with_nop(
    stack: LocalStack, built: dict[str, str], docker_base: str
) -> None:
    runs = {}
    for example in built:
        for agent in ("oracle", "nop"):
            out = cli(
                stack,
                "task",
                "run",
                str(EXAMPLES / example),
                "--agent",
                agent,
                "--build-arg",
                f"BASE={docker_base}",
            )
            runs[example, agent] = out.stdout.split()[0]
    with stack.client() as c:
        for (example, agent), episode_id in runs.items():
            final = c.wait(episode_id, ["SUCCEEDED", "FAILED"], timeout_s=120)
            trajectory = c.trajectory(episode_id)
            assert final.state == "SUCCEEDED", (example, agent, final.reason, trajectory.verifier_log)
            assert final.reward == (1.0 if agent == "oracle" else 0.0), (
                example,
                agent,
                trajectory.verifier_log,
            )
            assert final.labels["task"] == f"stasis-examples/{example}" and final.labels["agent"] == agent
        metrics = {
            agent: c.trajectory(runs["sort-metrics", agent]).reward_metrics for agent in ("oracle", "nop")
        }
        assert metrics == {"oracle": {"sorted": 1.0, "sum": 1.0}, "nop": {"sorted": 0.0, "sum": 0.0}}
        assert "PASS: config.ini is as asked" in c.trajectory(runs["fix-config", "oracle"]).verifier_log


@pytest.mark.timeout(300)
def test_a_hostile_agent_gets_its_honest_grade(
    stack: LocalStack, built: dict[str, str], tmp_path: Path
) -> None:
    """The tests run the image's programs, from /tests as the task ships them, into a reward
    channel that starts empty, and the agent's symlink resolves in the verifier's root, never on
    the node."""
    answer = tmp_path / "answer.ini"
    answer.write_text("[service]\nname = demo\nport = 8080\ntls = on\nworkers = 4\n")
    task = load_task(EXAMPLES / "fix-config")
    spec = task_episode(task, TaskAgent("hostile", ("sh", "-c", HOSTILE)), image=built["fix-config"])
    with stack.client() as c:
        hostile = c.submit(dataclasses.replace(spec, env={"NODE_ANSWER": str(answer)}))
        final = c.wait(hostile.id, ["SUCCEEDED", "FAILED"], timeout_s=120)
        log = c.trajectory(hostile.id).verifier_log
    assert final.state == "SUCCEEDED" and final.reward == 0.0, (final.reason, log)
    assert "FAIL: config.ini is:" in log and "forged" in cli(stack, "logs", hostile.id).stdout


@pytest.mark.timeout(300)
def test_a_test_run_that_fails_times_out_or_writes_no_reward_fails_the_episode(
    stack: LocalStack, built: dict[str, str], tmp_path: Path
) -> None:
    failing = {
        "exit 3": ("echo 1 > /logs/verifier/reward.txt; exit 3", "exited with code 3"),
        "no reward": ("echo nothing written", "wrote no reward"),
        "too slow": ("sleep 30; echo 1 > /logs/verifier/reward.txt", "ran past [verifier] timeout_sec"),
        "bad reward": ('echo \'{"a": 1, "b": 0}\' > /logs/verifier/reward.json', "no 'reward'"),
    }
    started = {}
    with stack.client() as c:
        for what, (script, _) in failing.items():
            broken = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / what.replace(" ", "-")))
            (broken / "tests" / "test.sh").write_text(f"#!/bin/bash\n{script}\n")
            toml = broken / "task.toml"
            toml.write_text(toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 3.0"))
            spec = task_episode(load_task(broken), TaskAgent("nop", ("true",)), image=built["fix-config"])
            started[what] = c.submit(spec).id
        for what, episode_id in started.items():
            final = c.wait(episode_id, ["SUCCEEDED", "FAILED"], timeout_s=120)
            assert final.state == "FAILED" and final.reward is None, (what, final.state, final.reward)
            assert failing[what][1] in final.reason, (what, final.reason)


@pytest.mark.timeout(900)
def test_claude_code_laid_over_a_task_survives_preemption_mid_stream_and_is_graded(
    stack: LocalStack, built: dict[str, str], model: ReferenceModelServer, tmp_path: Path
) -> None:
    """Claude Code, as it ships, in a layer over the task's environment: frozen mid-stream,
    resumed on the other node, every turn on policy; then graded from the environment alone,
    where no claude is, with its trajectory as ATIF where Harbor's tests read it."""
    # The task's tests, and a line of what they found of the agent's trajectory at /logs/agent.
    task_dir = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / "fix-config"))
    with open(task_dir / "tests" / "test.sh", "a") as f:
        f.write(READ_TRAJECTORY)
    task = load_task(task_dir)
    agent = claude_code(task, str(CLAUDE))
    with stack.client() as c:
        laid = taskimage.ensure_agent_image(c, built["fix-config"], agent)
        assert taskimage.ensure_agent_image(c, built["fix-config"], agent) == laid, "made once"
    spec = task_episode(task, agent, image=built["fix-config"], agent_image=laid)
    spec = dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, memory_mb=2048))
    turns = preempted_mid_generation_and_finished(stack, model, spec, "messages")
    assert all(t.delivered.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n') for t in turns)
    with stack.client() as c:
        final = c.get(turns[0].episode_id)
        log = c.trajectory(final.id).verifier_log
    assert final.state == "SUCCEEDED" and final.reward in (0.0, 1.0), (final.reason, log)
    assert ("FAIL: config.ini is:" in log) == (final.reward == 0.0), log
    found = re.search(rf"ATIF-v1\.8 trajectory {final.id}: (\d+) agent steps", log)
    assert found and 3 <= int(found.group(1)) <= len(turns), log


READ_TRAJECTORY = """
python3 - <<'EOF'
import json
doc = json.load(open("/logs/agent/trajectory.json"))
steps = [s for s in doc["steps"] if s["source"] == "agent"]
print(doc["schema_version"], "trajectory", doc["session_id"] + ":", len(steps), "agent steps")
EOF
"""


PROBE = r"""
import os, socket
for name in ("ALLOWED", "OTHER"):
    host, port = os.environ[name].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(name, "open", flush=True)
    except OSError as exc:
        print(name, "closed:", exc, flush=True)
"""


@pytest.mark.timeout(300)
def test_allowed_hosts_let_the_agent_reach_those_and_nothing_else(
    stack: LocalStack, built: dict[str, str], tmp_path: Path
) -> None:
    """Two servers on addresses of this machine the test adds: the task allows one of them."""
    addresses = ("10.254.254.1", "10.254.254.2")
    for address in addresses:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    servers = [socket.create_server((address, 0)) for address in addresses]
    try:
        allowed, other = (f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in servers)
        task_dir = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / "fix-config"))
        toml = task_dir / "task.toml"
        toml.write_text(toml.read_text().replace("[agent]\n", f'[agent]\nallowed_hosts = ["{allowed}"]\n'))
        task = load_task(task_dir)
        assert task.egress == (allowed,)
        spec = task_episode(task, TaskAgent("probe", ("python3", "-c", PROBE)), image=built["fix-config"])
        with stack.client() as c:
            probe = c.submit(dataclasses.replace(spec, env={"ALLOWED": allowed, "OTHER": other}))
            final = c.wait(probe.id, ["SUCCEEDED", "FAILED"], timeout_s=120)
        log = cli(stack, "logs", probe.id).stdout
        assert final.state == "SUCCEEDED", (final.reason, log)
        assert "ALLOWED open" in log and "OTHER closed" in log, log
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
        assert "stasis-egress:" not in rules, "the sandbox's rules go with it"
    finally:
        for s in servers:
            s.close()
        for address in addresses:
            subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)
