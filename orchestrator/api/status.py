"""Errors become gRPC status codes here and nowhere else in the orchestrator's services; `rpc`
also refuses, before any handler runs, a request whose text holds a NUL (`text`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from orchestrator.api.text import refuse_nul
from orchestrator.domain import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StasisError,
    TemporaryError,
    Unauthenticated,
)
from protos.shared.status import guarded, snapshot_status
from snapshots import SnapshotError

F = TypeVar("F", bound=Callable[..., Any])

STATUS: tuple[tuple[type[StasisError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Conflict, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (TemporaryError, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)
"""Each family of control-plane errors; any other StasisError is INTERNAL."""


def abort(context: grpc.ServicerContext, exc: StasisError | SnapshotError) -> None:
    if isinstance(exc, SnapshotError):
        context.abort(snapshot_status(exc), f"snapshot store: {exc}")
    code = next((c for kind, c in STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)
    context.abort(code, str(exc))


def rpc(method: F) -> F:
    """Refuse a request whose text holds a NUL (`text`), and map Stasis and snapshot errors to
    status codes, for unary and server-streaming methods."""
    return guarded(
        method, (StasisError, SnapshotError), lambda _, context, exc: abort(context, exc), refuse_nul
    )


def required(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return value
