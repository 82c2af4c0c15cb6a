"""Stasis control plane. The public surface for trainer code is the typed client."""

from orchestrator.client import EpisodeInfo, EventInfo, NodeInfo, SnapshotInfo, StasisClient
from orchestrator.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermanentError,
    StasisError,
    TemporaryError,
)
from orchestrator.model import EpisodeSpec, EpisodeState, Limits, Preemption, Resources, RewardSpec

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
]
