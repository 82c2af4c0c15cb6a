"""Harbor tasks end to end: the example tasks built with Docker into a local stack, run with the
oracle and with a no-op agent, graded in sandboxes as Harbor grades; a hostile agent that tries
to forge its grade; and test runs that fail, which FAIL the episode with the reason."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.local import LocalStack
from orchestrator.task import TaskAgent, load_task, task_episode
from tests.orchestrator.conftest import cli

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


@pytest.mark.timeout(420)
def test_example_tasks_are_built_once_pass_with_the_oracle_and_fail_with_nop(
    make_stack: Callable[..., LocalStack], dockerd: str, docker_base: str, tmp_path: Path
) -> None:
    stack = make_stack(nodes=1, slots=3)
    env = {"DOCKER_HOST": dockerd}
    base = ("--build-arg", f"BASE={docker_base}")
    names = {}
    for example in sorted(EXAMPLES.iterdir()):
        first = cli(stack, "task", "build", str(example), *base, env=env).stdout.split()
        assert first[1] == "built", first
        names[example.name] = first[0]
    again = cli(stack, "task", "build", str(EXAMPLES / "fix-config"), *base, env=env)
    assert again.stdout.split() == [names["fix-config"], "cached"], again.stdout + again.stderr
    changed = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / "fix-config"))
    with open(changed / "environment" / "Dockerfile", "a") as f:
        f.write("RUN echo changed > /etc/changed\n")
    rebuilt = cli(stack, "task", "build", str(changed), *base, env=env).stdout.split()
    assert rebuilt[1] == "built" and rebuilt[0] != names["fix-config"], rebuilt

    runs = {}
    for example in names:
        for agent in ("oracle", "nop"):
            out = cli(stack, "task", "run", str(EXAMPLES / example), "--agent", agent, *base, env=env).stdout
            runs[example, agent] = out.split()[0]
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

        # A hostile agent gets its honest grade: the tests run the image's programs, from
        # /tests as the task ships them, into a reward channel that starts empty, and its symlink
        # resolves in the verifier's root, never on the node.
        answer = tmp_path / "answer.ini"
        answer.write_text("[service]\nname = demo\nport = 8080\ntls = on\nworkers = 4\n")
        task = load_task(EXAMPLES / "fix-config")
        spec = task_episode(task, TaskAgent("hostile", ("sh", "-c", HOSTILE)), image=names["fix-config"])
        hostile = c.submit(dataclasses.replace(spec, env={"NODE_ANSWER": str(answer)}))
        final = c.wait(hostile.id, ["SUCCEEDED", "FAILED"], timeout_s=120)
        log = c.trajectory(hostile.id).verifier_log
        assert final.state == "SUCCEEDED" and final.reward == 0.0, (final.reason, log)
        assert "FAIL: config.ini is:" in log and "forged" in cli(stack, "logs", hostile.id).stdout

        # A test run that fails, times out or writes no reward FAILS the episode with the reason.
        failing = {
            "exit 3": ("echo 1 > /logs/verifier/reward.txt; exit 3", "exited with code 3"),
            "no reward": ("echo nothing written", "wrote no reward"),
            "too slow": ("sleep 30; echo 1 > /logs/verifier/reward.txt", "ran past [verifier] timeout_sec"),
            "bad reward": ('echo \'{"a": 1, "b": 0}\' > /logs/verifier/reward.json', "no 'reward'"),
        }
        started = {}
        for what, (script, _) in failing.items():
            broken = Path(shutil.copytree(EXAMPLES / "fix-config", tmp_path / what.replace(" ", "-")))
            (broken / "tests" / "test.sh").write_text(f"#!/bin/bash\n{script}\n")
            toml = broken / "task.toml"
            toml.write_text(toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 3.0"))
            spec = task_episode(load_task(broken), TaskAgent("nop", ("true",)), image=names["fix-config"])
            started[what] = c.submit(spec).id
        for what, episode_id in started.items():
            final = c.wait(episode_id, ["SUCCEEDED", "FAILED"], timeout_s=120)
            assert final.state == "FAILED" and final.reward is None, (what, final.state, final.reward)
            assert failing[what][1] in final.reason, (what, final.reason)
