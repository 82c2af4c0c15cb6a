"""Leadership among orchestrators that share one state database: which one runs the control loop.

Exactly one orchestrator leads: it runs the control loop, the node registry and the gateway. Any
other stands by: it serves reads and takes the lease when the leader's lapses. On PostgreSQL the
lease is a session advisory lock (`postgres_database.PostgresLease`), and it fences the store:
while this orchestrator does not hold it, every write transaction is refused, so a leader that
lost its lease can no longer change anything. The embedded SQLite store belongs to one process,
which always leads (`SoleLease`).
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.domain import StandingBy


class Lease(Protocol):
    holder: str
    """This orchestrator, for people: its host and address."""

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True if this orchestrator holds it now."""

    def held(self) -> bool:
        """Whether this orchestrator still holds the lease (False once it has lapsed)."""

    def leader(self) -> str:
        """Who holds the lease, for people: a standby names the leader in its refusals."""

    def release(self) -> None:
        """Give the lease up, so a standby may take over at once."""


def standing_by(lease: Lease) -> StandingBy:
    """The refusal of what only the leader may do, on an orchestrator that does not lead."""
    return StandingBy(
        f"this orchestrator ({lease.holder}) stands by and changes nothing; the leader is {lease.leader()}"
    )


class SoleLease:
    """The lease of an orchestrator on its own embedded database: always its own."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def try_acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return True

    def leader(self) -> str:
        return self.holder

    def release(self) -> None:
        pass
