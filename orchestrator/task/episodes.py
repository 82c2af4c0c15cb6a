"""A Harbor task as an episode spec: the agent in the task's environment image, and a verifier
that grades as Harbor grades, from the pristine image (docs/tasks.md).

- The agent's sandbox is the environment image with the agent's command. It never holds tests/
  or the reward channel; only the oracle gets solution/, at /solution.
- The verifier's root is the same image as built, never the agent's layer. It holds tests/ at
  /tests and Stasis's grader (`grader.sh`), which copies the agent's files in at their own
  paths, runs `bash /tests/test.sh` from the image's WORKDIR, and reports the reward file it
  wrote. `RewardSpec.output = "harbor"` reads that report (`reward.py`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from importlib import resources

from orchestrator.domain import EpisodeSpec, InvalidArgument, Limits, RewardSpec
from orchestrator.task.format import Task

GRADER_DIR = "/.stasis-task"
MARGIN_S = 120.0
"""Beyond a task's timeout, what the sandbox is given before Stasis stops it: the agent's own
`timeout` ends it first, and the grader's copy of the agent's files takes time too."""


@dataclass(frozen=True)
class TaskAgent:
    """What works on a task: a command in the environment image, and files placed for it."""

    name: str
    command: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)


def oracle(task: Task) -> TaskAgent:
    """Harbor's oracle: the task's own solution/solve.sh, from /solution."""
    if "solve.sh" not in task.solution:
        raise InvalidArgument("agent", f"oracle runs solution/solve.sh, and task {task.name!r} has none")
    files = {f"/solution/{path}": content for path, content in task.solution.items()}
    return TaskAgent("oracle", ("bash", "/solution/solve.sh"), files)


def nop() -> TaskAgent:
    """Harbor's nop agent: does nothing, so the tests grade the environment as built."""
    return TaskAgent("nop", ("true",))


AGENTS = {"oracle": oracle, "nop": lambda task: nop()}
"""The agents `stasis task run --agent` names."""


def task_episode(
    task: Task,
    agent: TaskAgent,
    graded: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
    image: str = "",
) -> EpisodeSpec:
    """The episode that runs `agent` on `task`. `graded`: the absolute paths whose final
    contents the tests see at their own paths (default: the image's WORKDIR). `image`: the
    environment as built from the task's environment/ (`stasis task build`), for a task
    without docker_image."""
    image = image or task.image
    if not image:
        raise InvalidArgument(
            "task.toml [environment] docker_image",
            "is not set: build environment/ first (stasis task build), or set it",
        )
    for path in graded:
        if not path.startswith("/") or path == "/" or any(c in path for c in " \t\n\0"):
            raise InvalidArgument("graded", f"{path!r} must be an absolute path other than / without blanks")
    timeout = f"{task.agent_timeout_s:g}"
    return EpisodeSpec(
        image=image,
        # The task's time limit, kept by `timeout` in the sandbox: an agent that runs out is
        # stopped and graded, as Harbor grades it. max_wall_s stops one that escaped it.
        entrypoint=("timeout", "-k", "10", timeout),
        command=agent.command,
        files=agent.files,
        resources=task.resources,
        limits=Limits(max_wall_s=task.agent_timeout_s + MARGIN_S),
        labels={"task": task.name[:253], "agent": agent.name[:253], **(labels or {})},
        reward=RewardSpec(
            command=("sh", f"{GRADER_DIR}/grader.sh"),
            files={
                f"{GRADER_DIR}/grader.sh": resources.files(__package__).joinpath("grader.sh").read_bytes(),
                f"{GRADER_DIR}/env": _env_file(task, graded),
                **{f"/tests/{path}": content for path, content in task.tests.items()},
            },
            timeout_s=task.verifier_timeout_s + MARGIN_S,
            output="harbor",
        ),
    )


def _env_file(task: Task, graded: tuple[str, ...]) -> bytes:
    """The grader's settings and `[verifier] env`, as the shell lines it sources."""
    env = {
        **task.verifier_env,
        "STASIS_TEST_TIMEOUT": f"{task.verifier_timeout_s:g}",
        "STASIS_GRADED": " ".join(graded),
    }
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()).encode()
