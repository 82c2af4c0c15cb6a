"""The event log: every transition and decision, and every node's registration and change of
state, numbered by `seq`. An event is written by the aggregate whose change it records, in that
change's transaction (`record`), so no change commits without its reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Protocol

from orchestrator.domain import Event, current_caller
from orchestrator.state.sql import Connection, Sql

WaitFor = Callable[[Callable[[], bool], float], bool]
"""Blocks until a predicate holds, the database closes, or a timeout passes; asks the predicate
again whenever events may have committed."""


class Events(Protocol):
    def read(self, since_seq: int = 0, episode_ids: Collection[str] = (), limit: int = 1000) -> list[Event]:
        """Events after `since_seq`, in order; of `episode_ids` only, if any are named."""

    def wait(self, since_seq: int, timeout: float) -> bool:
        """Block until an event newer than since_seq exists, the store closes, or timeout passes."""


def record(
    sql: Sql, db: Connection, episode_id: str, kind: str, from_state: str, to_state: str, reason: str,
    node: str, message: str,
) -> None:  # fmt: skip
    """Add an event in the caller's write transaction `db`, naming who asked."""
    caller = current_caller()
    db.execute(
        "INSERT INTO events (episode_id, kind, from_state, to_state, reason, message, node, at, actor)"
        " VALUES (?,?,?,?,?,?,?,?,?)",
        (
            episode_id, kind, str(from_state), str(to_state), reason, message, node, time.time(),
            str(caller) if caller else "",
        ),
    )  # fmt: skip
    sql.dialect.announce_events(db)


class SqlEvents:
    def __init__(self, sql: Sql, wait_for: WaitFor) -> None:
        self._sql = sql
        self._wait_for = wait_for

    def read(self, since_seq: int = 0, episode_ids: Collection[str] = (), limit: int = 1000) -> list[Event]:
        query, args = "SELECT * FROM events WHERE seq > ?", list[object]([since_seq])
        if episode_ids:
            condition, values = self._sql.dialect.one_of("episode_id", list(episode_ids))
            query += f" AND {condition}"
            args += values
        with self._sql.read() as db:
            rows = db.execute(query + " ORDER BY seq LIMIT ?", (*args, limit)).fetchall()
        return [Event(**r) for r in rows]

    def wait(self, since_seq: int, timeout: float) -> bool:
        return self._wait_for(lambda: self._last_seq() > since_seq, timeout)

    def _last_seq(self) -> int:
        with self._sql.read() as db:
            row = db.execute("SELECT COALESCE(MAX(seq), 0) AS seq FROM events").fetchone()
        return int(row["seq"]) if row else 0
