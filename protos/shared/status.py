"""The gRPC status code each snapshot store error crosses the wire with. The one table both
services (the orchestrator's and the node agent's) map snapshot errors through, and the one
wrapper both put around their handlers to turn errors into statuses."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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


F = TypeVar("F", bound=Callable[..., Any])
Abort = Callable[[Any, grpc.ServicerContext, Any], None]


def guarded(
    method: F,
    errors: tuple[type[BaseException], ...],
    abort: Abort,
    check: Callable[[Any], None] = lambda request: None,
) -> F:
    """`method`, a unary or server-streaming handler, with any of `errors` it raises handed to
    `abort(service, context, exc)`, which ends the call with a status. `check(request)` runs
    first, and what it raises is handled alike."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                check(request)
                yield from method(self, request, context)
            except errors as exc:
                abort(self, context, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            check(request)
            return method(self, request, context)
        except errors as exc:
            abort(self, context, exc)

    return unary  # type: ignore[return-value]
