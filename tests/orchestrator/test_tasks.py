"""Harbor tasks (`orchestrator/task`): a task directory read and checked, the episode it becomes,
and the reward its tests wrote, read as Harbor reads it. The end-to-end runs, in sandboxes, are in
test_tasks_e2e.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from orchestrator.domain import InvalidArgument
from orchestrator.task import (
    AGENTS,
    agent_logs,
    claude_code,
    context_digest,
    load_task,
    nop,
    oracle,
    read_reward,
    task_episode,
)
from orchestrator.task.episodes import GRADER_DIR, MAX_TRAJECTORY_BYTES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _copy(tmp_path: Path, example: str = "fix-config") -> Path:
    return Path(shutil.copytree(EXAMPLES / example, tmp_path / example))


@pytest.mark.timeout(10)
def test_every_example_task_reads_and_becomes_a_valid_episode() -> None:
    for directory in sorted(EXAMPLES.iterdir()):
        task = load_task(directory)
        assert task.name == f"stasis-examples/{directory.name}" and task.instruction.strip()
        assert task.image == "" and task.context == directory / "environment"
        assert "test.sh" in task.tests and "solve.sh" in task.solution
        for agent in AGENTS:
            spec = task_episode(
                task, AGENTS[agent](task), image="task-x", agent_image="task-x-with"
            ).validate()
            assert spec.labels == {"task": task.name, "agent": agent}
            assert spec.reward is not None and spec.reward.image == "task-x", (
                "the tests' root is the environment"
            )
    sort = load_task(EXAMPLES / "sort-metrics")
    assert sort.verifier_env == {"EXPECTED_SUM": "2050"} and sort.verifier_timeout_s == 60.0
    assert sort.resources.memory_mb == 512 and sort.resources.disk_mb == 10240


@pytest.mark.timeout(10)
def test_the_agent_never_holds_the_tests_and_only_the_oracle_holds_the_solution() -> None:
    task = load_task(EXAMPLES / "fix-config")
    by_oracle = task_episode(task, oracle(task), image="task-x")
    by_nop = task_episode(task, nop(), image="task-x", graded=("/app", "/srv/out"))
    assert set(by_oracle.files) == {"/solution/solve.sh"} and by_nop.files == {}
    for spec in (by_oracle, by_nop):
        assert spec.reward is not None and spec.reward.output == "harbor"
        assert spec.reward.files["/tests/test.sh"] == task.tests["test.sh"]
        assert not any(path.startswith(("/tests", GRADER_DIR)) for path in spec.files)
        assert spec.reward.command == ("sh", f"{GRADER_DIR}/grader.sh")
        assert spec.entrypoint == ("timeout", "-k", "10", "300")  # [agent] timeout_sec
        assert spec.limits.max_wall_s > 300 and spec.reward.timeout_s > 60
    env = by_nop.reward.files[f"{GRADER_DIR}/env"].decode()  # type: ignore[union-attr]
    assert "export STASIS_GRADED='/app /srv/out'\n" in env and "export STASIS_TEST_TIMEOUT=60\n" in env


@pytest.mark.timeout(10)
def test_claude_code_is_laid_over_the_environment_and_given_the_instruction() -> None:
    task = load_task(EXAMPLES / "fix-config")
    agent = claude_code(task, "/opt/claude")
    assert agent.layer == {"/usr/local/bin/claude": "/opt/claude"}
    with pytest.raises(InvalidArgument, match="give the image that has it"):
        task_episode(task, agent, image="task-x")
    spec = task_episode(task, agent, image="task-x", agent_image="task-x-claude")
    assert spec.image == "task-x-claude" and spec.reward is not None and spec.reward.image == "task-x"
    assert spec.files["/.stasis-task/instruction.md"] == task.instruction.encode()
    assert spec.env["IS_SANDBOX"] == "1" and "claude -p" in spec.command[-1]


@pytest.mark.timeout(10)
def test_verifier_env_values_reach_the_grader_quoted_as_they_are(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text() + '\n[verifier.env]\nTOKEN = "a\'b $(rm -rf /) `x`"\n')
    spec = task_episode(load_task(task_dir), nop(), image="task-x")
    env = spec.reward.files[f"{GRADER_DIR}/env"].decode()  # type: ignore[union-attr]
    assert "export TOKEN='a'\"'\"'b $(rm -rf /) `x`'\n" in env


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            ("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = -1"),
            "[agent] timeout_sec",
            "must be a number",
        ),
        (("[agent]\ntimeout_sec = 300.0", '[agent]\ntimeout_sec = "5m"'), "[agent] timeout_sec", "'5m'"),
        (("[agent]\n", '[agent]\nuser = "agent"\n'), "[agent] user", "not supported by Stasis yet"),
        (("[verifier]\n", '[verifier]\nuser = "tester"\n'), "[verifier] user", "USER"),
        (("[agent]\n", '[agent]\nallowed_hosts = ["pypi.org"]\n'), "[agent] allowed_hosts[0]", "needs DNS"),
        (("[agent]\n", '[agent]\nallowed_hosts = ["10.0.0.0/8:0"]\n'), "[agent] allowed_hosts[0]", "port"),
        (("[agent]\n", '[agent]\nallowed_hosts = ["0.0.0.0/0"]\n'), "[agent] allowed_hosts[0]", "loopback"),
        (("[agent]\n", '[agent]\nallowed_hosts = "10.1.2.3"\n'), "[agent] allowed_hosts", "list of strings"),
        (
            ("[verifier]\n", '[verifier]\nallowed_hosts = ["10.1.2.3"]\n'),
            "[verifier] allowed_hosts",
            "no network",
        ),
        (("[environment]\n", "[environment]\ngpus = 1\n"), "[environment] gpus", "accelerators"),
        (("memory_mb = 512", "memory_mb = 8"), "[environment] memory_mb", "between 16"),
        (("cpus = 1", 'cpus = "two"'), "[environment] cpus", "not a number"),
        (("[verifier]\n", '[verifier]\nenv = { "1BAD" = "x" }\n'), "[verifier] env.1BAD", "not a valid"),
        (("[task]", "[task"), "task.toml", "not valid TOML"),
    ],
)
def test_a_bad_task_toml_is_refused_naming_the_field(
    tmp_path: Path, change: tuple[str, str], field: str, words: str
) -> None:
    task_dir = _copy(tmp_path)
    toml = task_dir / "task.toml"
    assert change[0] in toml.read_text()
    toml.write_text(toml.read_text().replace(change[0], change[1], 1))
    with pytest.raises(InvalidArgument) as caught:
        load_task(task_dir)
    assert field in caught.value.field and words in caught.value.problem, caught.value


@pytest.mark.timeout(10)
def test_a_task_missing_a_part_or_holding_a_symlink_is_refused(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    (task_dir / "tests" / "helper.sh").symlink_to("/etc/shadow")
    with pytest.raises(InvalidArgument, match=r"tests/helper.sh is a symlink"):
        load_task(task_dir)
    (task_dir / "tests" / "helper.sh").unlink()
    (task_dir / "tests" / "test.sh").unlink()
    with pytest.raises(InvalidArgument, match=r"test\.sh is missing"):
        load_task(task_dir)
    shutil.copy(EXAMPLES / "fix-config" / "tests" / "test.sh", task_dir / "tests")
    shutil.rmtree(task_dir / "environment")
    with pytest.raises(InvalidArgument, match=r"docker_image.*no .*Dockerfile to build"):
        load_task(task_dir)
    with pytest.raises(InvalidArgument, match=r"instruction\.md is missing"):
        (task_dir / "instruction.md").unlink()
        load_task(task_dir)
    task = load_task(_copy(tmp_path, "sort-metrics"))
    with pytest.raises(InvalidArgument, match="build environment/ first"):
        task_episode(task, nop())
    shutil.rmtree(tmp_path / "sort-metrics" / "solution")
    with pytest.raises(InvalidArgument, match=r"oracle runs solution/solve\.sh"):
        oracle(load_task(tmp_path / "sort-metrics"))


@pytest.mark.timeout(10)
def test_a_build_context_digest_changes_with_any_file_or_argument_and_nothing_else(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    task = load_task(task_dir)
    first = context_digest(task, {"BASE": "b:1"})
    assert context_digest(load_task(task_dir), {"BASE": "b:1"}) == first
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task_dir / "instruction.md").write_text("something else\n")
    assert context_digest(load_task(task_dir), {"BASE": "b:1"}) == first, "only environment/ counts"
    assert context_digest(task, {"BASE": "b:2"}) != first
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN true\n")
    assert context_digest(task, {"BASE": "b:1"}) != first
    pinned = load_task(task_dir)
    object.__setattr__(pinned, "context", None)
    with pytest.raises(InvalidArgument, match="nothing to build"):
        context_digest(pinned, {})


def _line(exit_code: int, rest: str) -> bytes:
    return f"test output\nstasis-task exit={exit_code} {rest}\n".encode()


@pytest.mark.timeout(10)
def test_the_reward_is_read_as_harbor_reads_it() -> None:
    assert read_reward(_line(0, "reward.txt 0.75")) == (0.75, {})
    assert read_reward(_line(0, "reward.txt  1 ")) == (1.0, {})
    assert read_reward(_line(0, 'reward.json {"reward": 0.5, "sorted": 1, "sum": 0}')) == (
        0.5,
        {"sorted": 1.0, "sum": 0.0},
    )
    assert read_reward(_line(0, 'reward.json {"accuracy": 0.25}')) == (0.25, {})


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("log", "words"),
    [
        (_line(3, "reward.txt 1"), "exited with code 3"),
        (_line(124, "reward.txt 1"), "ran past [verifier] timeout_sec"),
        (_line(0, "none"), "wrote no reward"),
        (b"reward: 1\n", "ended without its 'stasis-task' line"),
        (b"", "ended without"),
        (_line(0, "reward.txt nan"), "'nan' is not a finite number"),
        (_line(0, "reward.txt 1e400"), "not a finite number"),
        (_line(0, "reward.txt pass"), "'pass' is not a number"),
        (_line(0, "reward.txt"), "is not a number"),
        (_line(0, "reward.json {"), "reward.json is not JSON"),
        (_line(0, "reward.json [1]"), "object of named numbers"),
        (_line(0, "reward.json {}"), "object of named numbers"),
        (_line(0, 'reward.json {"a": 1, "b": 2}'), "no 'reward'"),
        (_line(0, 'reward.json {"reward": true}'), "is true, not a number"),
        (_line(0, 'reward.json {"reward": "1"}'), 'is "1", not a number'),
        (_line(0, 'reward.json {"reward": 1, "x": null}'), "is null, not a number"),
        (_line(0, 'reward.json {"reward": 1e999}'), "not a finite number"),
    ],
)
def test_a_run_that_failed_or_a_bad_reward_is_an_error_never_a_zero(log: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        read_reward(log)


@pytest.mark.timeout(10)
def test_the_agents_trajectory_is_where_harbors_tests_read_it_unless_it_is_too_big() -> None:
    assert agent_logs([]) == {}
    assert agent_logs([b"{main}", b"{after}"]) == {
        "/logs/agent/trajectory.json": b"{main}",
        "/logs/agent/trajectory.cont-1.json": b"{after}",
    }
    assert agent_logs([b"x" * (MAX_TRAJECTORY_BYTES + 1)]) == {}
