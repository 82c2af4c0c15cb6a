"""The control plane's domain: episodes and their specs, states and events, nodes, snapshot
records, images, roles and callers, ids, errors, and the plain-data codec for them.

Owns the words every other room speaks. Imports nothing else of Stasis but the shared room's
bounds of a sandbox's resources (`protos.shared.resources`, the node agent's too) and the
snapshot store's `Reason` (why a snapshot is taken, one set of words on both sides): no protobuf,
no gRPC, no storage.
"""

from orchestrator.domain.access import Caller, Role, acting_for, current_caller, may_read_hidden
from orchestrator.domain.episode import ALLOWED, TERMINAL, Episode, EpisodeState, Event, Origin
from orchestrator.domain.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermanentError,
    PermissionDenied,
    StandingBy,
    StasisError,
    TemporaryError,
    Unauthenticated,
)
from orchestrator.domain.group import MAX_GROUP_SIZE, Group, GroupMember, GroupOutcome
from orchestrator.domain.image import ImageRecord, PullStatus, check_name, is_pinned, is_reference
from orchestrator.domain.node import NodeRecord, NodeState
from orchestrator.domain.snapshot import Reason, SnapshotRecord
from orchestrator.domain.spec import EpisodeSpec, Limits, Preemption, Resources, RewardSpec

__all__ = [
    "ALLOWED",
    "MAX_GROUP_SIZE",
    "TERMINAL",
    "Caller",
    "Conflict",
    "Episode",
    "EpisodeSpec",
    "EpisodeState",
    "Event",
    "FailedPrecondition",
    "Group",
    "GroupMember",
    "GroupOutcome",
    "ImageRecord",
    "InvalidArgument",
    "Limits",
    "NodeRecord",
    "NodeState",
    "NotFound",
    "Origin",
    "PermanentError",
    "PermissionDenied",
    "Preemption",
    "PullStatus",
    "Reason",
    "Resources",
    "RewardSpec",
    "Role",
    "SnapshotRecord",
    "StandingBy",
    "StasisError",
    "TemporaryError",
    "Unauthenticated",
    "acting_for",
    "check_name",
    "current_caller",
    "is_pinned",
    "is_reference",
    "may_read_hidden",
]
