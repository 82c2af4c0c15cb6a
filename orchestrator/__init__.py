"""Stasis control plane: the `stasis` CLI, the gRPC API, the control loop and scheduler, the
inference gateway, the trajectory ledger and durable state (SQLite or PostgreSQL). The public
surface for trainer code is the typed client, the episode spec and the errors it raises.

Its rooms are listed once, in docs/architecture.md ("Rooms"); the import-linter contracts in
pyproject.toml ([tool.importlinter]) enforce their layering.
"""

from orchestrator.client import EpisodeInfo, EventInfo, NodeInfo, SnapshotInfo, StasisClient, load_spec_file
from orchestrator.domain import (
    Conflict,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    InvalidArgument,
    Limits,
    NotFound,
    PermanentError,
    Preemption,
    Resources,
    RewardSpec,
    StasisError,
    TemporaryError,
)

__all__ = [
    "Conflict",
    "EpisodeInfo",
    "EpisodeSpec",
    "EpisodeState",
    "EventInfo",
    "FailedPrecondition",
    "InvalidArgument",
    "Limits",
    "NodeInfo",
    "NotFound",
    "PermanentError",
    "Preemption",
    "Resources",
    "RewardSpec",
    "SnapshotInfo",
    "StasisClient",
    "StasisError",
    "TemporaryError",
    "load_spec_file",
]
