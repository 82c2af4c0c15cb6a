"""Stasis node agent: sandboxes on one node, checkpointed with CRIU and restored anywhere.

Its rooms are listed once, in docs/architecture.md ("Rooms"); the import-linter contracts in
pyproject.toml ([tool.importlinter]) enforce their layering. A request is followed from
`server/service.py` into `node/node.py`, and from there into the module of its operation
(`node/create.py`, `checkpoint.py`, `restore.py`, `remove.py`, `verify.py`).
"""

from sandbox_agent.checkpoint import CheckpointImage, Sizes
from sandbox_agent.errors import (
    AgentError,
    AlreadyExists,
    Busy,
    CheckpointCorrupt,
    CommandFailed,
    FailedPrecondition,
    ImageMismatch,
    ImageRejected,
    InvalidSpec,
    NotFound,
    ToolUnavailable,
)
from sandbox_agent.node import ForkMark, Identity, Node
from sandbox_agent.phases import Phase, PhaseHooks
from sandbox_agent.server.service import serve
from sandbox_agent.settings import AgentSettings
from sandbox_agent.spec import Resources, SandboxSpec, SandboxState, SandboxStatus

__all__ = [
    "AgentError",
    "AgentSettings",
    "AlreadyExists",
    "Busy",
    "CheckpointCorrupt",
    "CheckpointImage",
    "CommandFailed",
    "FailedPrecondition",
    "ForkMark",
    "Identity",
    "ImageMismatch",
    "ImageRejected",
    "InvalidSpec",
    "Node",
    "NotFound",
    "Phase",
    "PhaseHooks",
    "Resources",
    "SandboxSpec",
    "SandboxState",
    "SandboxStatus",
    "Sizes",
    "ToolUnavailable",
    "serve",
]
