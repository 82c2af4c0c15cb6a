"""Errors of the control plane. Each family maps to one gRPC status code in `api.status`."""

from __future__ import annotations


class StasisError(Exception):
    """Root of every error Stasis raises on purpose."""


class InvalidArgument(StasisError):
    """A request field is malformed; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(StasisError):
    """An episode, node or snapshot the request names does not exist."""


class FailedPrecondition(StasisError):
    """The request is well formed but the current state refuses it."""


class Conflict(StasisError):
    """A request id was reused for a different request."""


class Unauthenticated(StasisError):
    """The call carries no credential this Stasis accepts."""


class PermissionDenied(StasisError):
    """The caller is known, but its role (or node certificate) does not allow this call."""


class TemporaryError(StasisError):
    """Worth retrying after `delay` seconds: an agent or the store is unreachable or busy."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class StandingBy(TemporaryError):
    """This orchestrator is a standby: it serves reads, and the leader does the rest."""


class PermanentError(StasisError):
    """An agent refused for a reason that retrying will not change (bad image, corrupt snapshot)."""
