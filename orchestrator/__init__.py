"""Stasis control plane. The public surface for trainer code is the typed client, the episode
spec and the errors it raises.

Rooms, from the top (import-linter checks that each imports only those below it):

    cli/              the `stasis` command and `stasis up`, the local stack
    api/ | client/    the gRPC services and process wiring | the typed client and spec files
    control/          the control loop: scheduling, operations on nodes, settling, retention
    gateway/          the inference gateway
    trajectory/       the trajectory ledger, its exports and the published policy versions
    state/            durable state, one aggregate a module, in SQLite or PostgreSQL
    wire              protobuf <-> domain records, by field name
    domain/           episodes, specs, nodes, snapshots, ids, errors

`reference_model/` stands alone: a model server `stasis up` runs beside the control plane.
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
