"""Harbor tasks: a task directory (instruction, task.toml, environment, tests, solution) read
and checked (`format`), run as a Stasis episode whose verifier grades the way Harbor grades
(`episodes`, `grader.sh`), and the reward its tests write, read as Harbor reads it (`reward`).
See docs/tasks.md."""

from orchestrator.task.episodes import AGENTS, TaskAgent, agent_logs, claude_code, nop, oracle, task_episode
from orchestrator.task.format import Task, context_digest, digest_tree, load_task
from orchestrator.task.reward import read_reward

__all__ = [
    "AGENTS",
    "Task",
    "TaskAgent",
    "agent_logs",
    "claude_code",
    "context_digest",
    "digest_tree",
    "load_task",
    "nop",
    "oracle",
    "read_reward",
    "task_episode",
]
