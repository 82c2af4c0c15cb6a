"""Request ids: a state-changing request that succeeded is remembered with a fingerprint of what
it asked, so a retry of it is not done twice and another request under its id is refused."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from orchestrator.state import records
from orchestrator.state.sql import Connection, Sql


class Requests(Protocol):
    def known(self, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None:
        """The target of an earlier request with this id; Conflict if that request was different."""

    def remember(self, request_id: str, method: str, payload: Mapping[str, Any], target: str) -> None:
        """Note a state-changing request that succeeded, so a retry of it is not done twice."""


def known(db: Connection, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None:
    """As `Requests.known`, on `db`: inside a write transaction, the one of the work it names."""
    records.check_request_id(request_id)
    row = db.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
    return records.check_known_request(request_id, method, payload, row) if row else None


def remember(db: Connection, request_id: str, method: str, payload: Mapping[str, Any], target: str) -> None:
    """Store a request id in the write transaction `db` of the work it names."""
    db.execute(
        "INSERT INTO requests VALUES (?,?,?,?,?)",
        (request_id, method, records.fingerprint(method, payload), target, time.time()),
    )


class SqlRequests:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql

    def known(self, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None:
        with self._sql.read() as db:
            return known(db, request_id, method, payload)

    def remember(self, request_id: str, method: str, payload: Mapping[str, Any], target: str) -> None:
        with self._sql.tx() as db:
            if known(db, request_id, method, payload) is None:
                remember(db, request_id, method, payload, target)
