"""Policy versions a trainer can order: the integer version a trainer publishes with each weight
update, kept beside the ledger's turns, and how stale a token is against it.

A trainer publishes versions that only go up (`PolicyVersions.publish`); every one is kept with
when it was published, so the current one is the largest. A turn whose upstream names no
version records the one published when its sampling began (the gateway reads `published` then).
A token's staleness is the published version when a sample is read minus the version the token
was sampled under, where both are integers; a version that is not an integer (an upstream's own
header, "policy-v1") has no order, and its tokens' staleness is unknown.

A GRPO group's `max_staleness` bounds its members (docs/trajectory.md, "Policy versions"): a
member's next turn is sampled under the published version, so its trajectory would then hold
tokens `oldest_staleness` versions older than that turn's. `beyond_bound` says when that is more
than the bound: the gateway then holds the turn back unsampled, and the control loop runs the
member again from the start.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.domain import InvalidArgument
from orchestrator.state.sql import Connection, SqlDatabase


@dataclass(frozen=True)
class PublishedPolicy:
    """A version a trainer published; version 0 is none (nothing published yet)."""

    version: int
    published_at: float
    """When it was published, on the orchestrator's clock; 0 for none."""


NONE = PublishedPolicy(0, 0.0)


class PolicyVersions:
    """The published policy versions, durable in the ledger's database (the `policy_versions`
    table of `schema`): every orchestrator on a PostgreSQL store, and one restarted on its
    SQLite file, reads the same current version."""

    def __init__(self, database: SqlDatabase) -> None:
        self._tx = database.tx
        self._read = database.read

    def publish(self, version: int) -> PublishedPolicy:
        """Make `version` the current one. InvalidArgument naming `version`, with nothing
        changed, unless it is a positive integer above the current one."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidArgument("version", f"{version!r} is not a positive integer")
        with self._tx() as db:  # the writer's lock: two publishes cannot both pass the check
            current = _current(db)
            if version <= current.version:
                raise InvalidArgument(
                    "version",
                    f"{version} is not above the published version {current.version}; "
                    "published versions only go up",
                )
            now = time.time()
            db.execute("INSERT INTO policy_versions (version, published_at) VALUES (?, ?)", (version, now))
        return PublishedPolicy(version, now)

    def current(self) -> PublishedPolicy:
        """The published version now; NONE if nothing was published."""
        with self._read() as db:
            return _current(db)

    def published(self) -> int:
        """The published version number now; 0 if nothing was published."""
        return self.current().version


def _current(db: Connection) -> PublishedPolicy:
    row = db.execute(
        "SELECT version, published_at FROM policy_versions ORDER BY version DESC LIMIT 1"
    ).fetchone()
    return PublishedPolicy(int(row["version"]), float(row["published_at"])) if row is not None else NONE


def ordered(version: str) -> int | None:
    """A recorded version as an integer, if it is one; None for "" or an upstream's own name."""
    text = version.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def staleness(published: int, version: str) -> int | None:
    """How many published versions a token sampled under `version` lags `published`; None if
    nothing is published or the version has no order."""
    sampled = ordered(version)
    return published - sampled if published and sampled is not None else None


def oldest_staleness(versions: Iterable[str], published: int) -> int | None:
    """The largest staleness among the versions of an episode's live turns (the hook a group's
    `max_staleness` compares); None if none of them can be ordered."""
    known = [s for v in versions if (s := staleness(published, v)) is not None]
    return max(known) if known else None


def beyond_bound(versions: Iterable[str], published: int, max_staleness: int | None) -> int | None:
    """How stale a member's oldest live token is, if a turn sampled now under `published` would
    put it more than `max_staleness` versions behind; None if the turn may be sampled (no bound,
    nothing published, or no version the member holds has an order)."""
    if max_staleness is None:
        return None
    lag = oldest_staleness(versions, published)
    return lag if lag is not None and lag > max_staleness else None


def stale_member(lag: int, published: int, max_staleness: int) -> str:
    """Why a member's next turn is not sampled, in the words its events and errors carry."""
    return (
        f"stale-bounded: its oldest live tokens are {lag} policy versions behind the published "
        f"version {published}, past its group's max_staleness {max_staleness}"
    )
