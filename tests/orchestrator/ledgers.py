"""Trajectory ledgers on a test's own database, SQLite's or PostgreSQL's, for the tests that hold
the ledger to the same semantics on both. On PostgreSQL the ledger lives in a state store's
database, as an orchestrator given `--database-url` keeps it; the server is the suite's own
(`tests/postgres.py`), with a fresh database for each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import pytest

from orchestrator.state import PostgresStateStore
from orchestrator.trajectory import Ledger
from orchestrator.trajectory.forks import ForkOrigin
from tests.postgres import PostgresServer


class OpenLedger(Protocol):
    def __call__(self, origins: Callable[[str], ForkOrigin | None] | None = None) -> Ledger:
        """Another ledger on the test's database; `origins` as `Ledger.sqlite` takes it."""


DATABASES = ["sqlite", "postgres"]
"""The params of a fixture built on `opener`."""


@contextmanager
def opener(request: pytest.FixtureRequest, path: Path) -> Iterator[OpenLedger]:
    """Opens ledgers on one database of the kind `request.param` names: the SQLite file at
    `path`, or a fresh PostgreSQL database. Each call opens another ledger on it, as another
    orchestrator, or the same one restarted, would; all are closed at the end."""
    server: PostgresServer | None = (
        request.getfixturevalue("postgres") if request.param == "postgres" else None
    )
    url = server.database() if server else ""
    ledgers: list[Ledger] = []
    stores: list[PostgresStateStore] = []

    def open_(origins: Callable[[str], ForkOrigin | None] | None = None) -> Ledger:
        if url:
            stores.append(PostgresStateStore(url))
            ledgers.append(Ledger.postgres(stores[-1].database, origins))
        else:
            ledgers.append(Ledger.sqlite(path, origins))
        return ledgers[-1]

    try:
        yield open_
    finally:
        for ledger in ledgers:
            ledger.close()
        for store in stores:
            store.close()
        if server:
            server.drop(url)
