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
    """What works on a task: a command in the environment image, its environment and the files
    placed for it, and what is laid over the image for it (a harness's program)."""

    name: str
    command: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    layer: dict[str, str] = field(default_factory=dict)
    """Paths in the image, each with the local file or directory laid there, read-only, in an
    image layer over the environment's (`client/taskimage.ensure_agent_image`). The tests never
    run on it: their root is the environment image without it."""


def oracle(task: Task) -> TaskAgent:
    """Harbor's oracle: the task's own solution/solve.sh, from /solution."""
    if "solve.sh" not in task.solution:
        raise InvalidArgument("agent", f"oracle runs solution/solve.sh, and task {task.name!r} has none")
    files = {f"/solution/{path}": content for path, content in task.solution.items()}
    return TaskAgent("oracle", ("bash", "/solution/solve.sh"), files)


def nop() -> TaskAgent:
    """Harbor's nop agent: does nothing, so the tests grade the environment as built."""
    return TaskAgent("nop", ("true",))


CLAUDE_CODE = "/var/cache/stasis/harnesses/claude-code-2.1.328/claude"
"""Where `scripts/host-setup.sh` puts the pinned Claude Code release (one native binary)."""
INSTRUCTION = f"{GRADER_DIR}/instruction.md"


def claude_code(task: Task, binary: str = CLAUDE_CODE) -> TaskAgent:
    """Claude Code, as it ships, laid over the environment at /usr/local/bin/claude, given
    instruction.md as its prompt in the image's WORKDIR, through the gateway (ANTHROPIC_BASE_URL)."""
    return TaskAgent(
        "claude-code",
        ("sh", "-c", f'exec claude -p "$(cat {INSTRUCTION})" --dangerously-skip-permissions'),
        files={INSTRUCTION: task.instruction.encode()},
        env={
            "HOME": "/root",
            "IS_SANDBOX": "1",  # as root, Claude Code refuses to skip permissions without it
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
        layer={"/usr/local/bin/claude": binary},
    )


AGENTS = {"oracle": oracle, "nop": lambda task: nop(), "claude-code": claude_code}
"""The agents `stasis task run --agent` names."""


def task_episode(
    task: Task,
    agent: TaskAgent,
    graded: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
    image: str = "",
    agent_image: str = "",
) -> EpisodeSpec:
    """The episode that runs `agent` on `task`. `graded`: the absolute paths whose final
    contents the tests see at their own paths (default: the image's WORKDIR). `image`: the
    environment as built from the task's environment/ (`stasis task build`), for a task
    without docker_image. `agent_image`: that environment with the agent's layer over it, for
    an agent that has one; the tests' root stays the environment alone."""
    image = image or task.image
    if agent.layer and not agent_image:
        raise InvalidArgument(
            "agent_image", f"agent {agent.name} is laid over the environment: give the image that has it"
        )
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
        image=agent_image or image,
        # The task's time limit, kept by `timeout` in the sandbox: an agent that runs out is
        # stopped and graded, as Harbor grades it. max_wall_s stops one that escaped it.
        entrypoint=("timeout", "-k", "10", timeout),
        command=agent.command,
        files=agent.files,
        env=agent.env,
        egress=task.egress,
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
            image=image,
            timeout_s=task.verifier_timeout_s + MARGIN_S,
            output="harbor",
        ),
    )


AGENT_LOGS = "/logs/agent"
MAX_TRAJECTORY_BYTES = 16 << 20
"""The most of the agent's trajectory the tests get: what the verifier's files can carry."""


def agent_logs(documents: list[bytes]) -> dict[str, bytes]:
    """The agent's trajectory where Harbor's verifiers read it: its ATIF documents, main's at
    /logs/agent/trajectory.json and each after a compaction at trajectory.cont-<k>.json; none
    past MAX_TRAJECTORY_BYTES in all (the tests then find no trajectory)."""
    if sum(len(d) for d in documents) > MAX_TRAJECTORY_BYTES:
        return {}
    return {
        f"{AGENT_LOGS}/trajectory{f'.cont-{k}' if k else ''}.json": doc for k, doc in enumerate(documents)
    }


def _env_file(task: Task, graded: tuple[str, ...]) -> bytes:
    """The grader's settings and `[verifier] env`, as the shell lines it sources."""
    env = {
        **task.verifier_env,
        "STASIS_TEST_TIMEOUT": f"{task.verifier_timeout_s:g}",
        "STASIS_GRADED": " ".join(graded),
    }
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()).encode()
