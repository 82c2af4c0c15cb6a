"""The gRPC status code each snapshot store error crosses the wire with. The one table both
services (the orchestrator's and the node agent's) map snapshot errors through."""

from __future__ import annotations

import grpc

from snapshots import (
    InvalidCheckpoint,
    InvalidSettings,
    InvalidSnapshotMeta,
    SnapshotCorrupt,
    SnapshotError,
    SnapshotExists,
    SnapshotNotFound,
    StoreLocked,
    StoreRejected,
    StoreUnavailable,
)

SNAPSHOT_STATUS: tuple[tuple[type[SnapshotError], grpc.StatusCode], ...] = (
    (InvalidSnapshotMeta, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidCheckpoint, grpc.StatusCode.INVALID_ARGUMENT),
    (SnapshotNotFound, grpc.StatusCode.NOT_FOUND),
    (SnapshotExists, grpc.StatusCode.ALREADY_EXISTS),
    (SnapshotCorrupt, grpc.StatusCode.DATA_LOSS),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (StoreLocked, grpc.StatusCode.UNAVAILABLE),
    (StoreRejected, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidSettings, grpc.StatusCode.FAILED_PRECONDITION),
)
"""Most specific first; any other snapshot error is INTERNAL."""


def snapshot_status(exc: SnapshotError) -> grpc.StatusCode:
    return next((code for kind, code in SNAPSHOT_STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)
