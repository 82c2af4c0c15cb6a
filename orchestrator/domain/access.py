"""Who is asking: the roles of the public API, and the caller a request acts for.

The caller is request-scoped (a context variable the API sets around each call), so every
event a request commits, however deep in the control plane, records who asked for it. Work
the control loop does on its own records no caller.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


class Role(enum.IntEnum):
    """Each role may do what the ones below it may."""

    VIEWER = 1
    """Read episodes, events, snapshots, nodes and images; never the hidden reward files."""
    TRAINER = 2
    """Submit and cancel episodes; read trajectories and harness logs."""
    OPERATOR = 3
    """Preempt, resume, drain, uncordon, export snapshots, import and remove images, read hidden files."""

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(r.name.lower() for r in cls)
            raise ValueError(f"unknown role {text!r} (one of {names})") from None

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Caller:
    name: str
    """Who holds the credential: a token's name, or a node's name for node calls."""
    role: Role

    def __str__(self) -> str:
        return f"{self.name} ({self.role})"


_CALLER: ContextVar[Caller | None] = ContextVar("stasis_caller", default=None)


@contextmanager
def acting_for(caller: Caller | None) -> Iterator[None]:
    """Within this block, state changes are made on behalf of `caller`."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


def current_caller() -> Caller | None:
    """The caller of the request being served in this thread; None for the control loop's own work
    and for a server without authentication."""
    return _CALLER.get()


def may_read_hidden() -> bool:
    """Whether this request may see the hidden reward files: only an authenticated operator (a
    server that does not authenticate shows them to no one)."""
    caller = current_caller()
    return caller is not None and caller.role >= Role.OPERATOR
