"""A whole orchestrator on PostgreSQL (`--database-url`): the API takes submits into the server
database, watchers hear of them through LISTEN/NOTIFY, and an orchestrator started afresh on
the same database finds everything, its ledger's turns included, with nothing in the SQLite file
of its state directory.

The PostgreSQL server is the suite's own (`tests/postgres.py`); no node agent runs, so the one
node is a record that caches the image, cordoned, so nothing is placed on it."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from orchestrator import InvalidArgument, StasisClient
from orchestrator.api import Orchestrator, OrchestratorSettings
from orchestrator.domain import NodeRecord, NodeState
from orchestrator.trajectory import CanonicalRequest
from tests.postgres import PostgresServer


@pytest.mark.timeout(120)
def test_an_orchestrator_on_postgresql_serves_from_it_and_a_new_one_finds_everything(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.database()
    settings = OrchestratorSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0", database_url=url)
    assert url not in repr(settings), "the URL carries a password"
    spec = {"image": "base", "command": ["python3", "agent.py"], "labels": {"run": "pg"}}

    first = Orchestrator(settings).start(gateway=False)
    try:
        first.store.nodes.upsert(
            NodeRecord(
                "node-1", "127.0.0.1:1", NodeState.CORDONED, "runc", 1, 1024,
                {"sha256:" + "a" * 64: ["base"]}, {}, time.time(),
            )
        )  # fmt: skip
        with StasisClient(first.address) as client:
            submitted = client.submit(spec, request_id="trainer-7")
            assert client.submit(spec, request_id="trainer-7").id == submitted.id
            with pytest.raises(InvalidArgument) as err:  # PostgreSQL's text refuses a NUL
                client.submit(spec, request_id="trainer-\0")
            assert err.value.field == "request_id"
            heard = next(iter(client.watch([submitted.id])))
            assert heard.episode_id == submitted.id
        request = CanonicalRequest.parse(
            "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        recorded = first.ledger.record(
            submitted.id, 1, 0.0, request, b"{}", {"role": "assistant", "content": "hello"}, b"response",
            "chat", b"delivered", [1, 2], [-0.5, -0.25], [3], "policy-v1", 1.0,
        )  # fmt: skip
        cursor = first.ledger.cursor(submitted.id)
    finally:
        first.stop()

    second = Orchestrator(settings).start(gateway=False)
    try:
        with StasisClient(second.address) as client:
            found = client.get(submitted.id)
            assert (found.state, found.spec.command, found.spec.labels) == (
                "PENDING", ("python3", "agent.py"), {"run": "pg"},
            )  # fmt: skip
            assert [e.id for e in client.episodes(labels={"run": "pg"})] == [submitted.id]
            assert client.submit(spec, request_id="trainer-7").id == submitted.id, "request ids survive too"
            assert [n.name for n in client.nodes()] == ["node-1"]
        assert second.ledger.turns(submitted.id) == [recorded], "the ledger is in PostgreSQL too"
        assert second.ledger.cursor(submitted.id) == cursor == {"turn": recorded.id, "turns": 1}
    finally:
        second.stop()

    with sqlite3.connect(tmp_path / "state" / "state.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"episodes", "turns"}, (
        "the state and the ledger went to PostgreSQL, not the state dir"
    )
