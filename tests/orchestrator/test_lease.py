"""The leadership lease on PostgreSQL, on its own: one holder at a time, a standby's writes
refused with the leader's name, and a leader cut off from the database fenced before it notices.

Two store instances on one database stand for two orchestrators; the server is the suite's own
(`tests/postgres.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from orchestrator.domain import NodeRecord, NodeState, StandingBy
from orchestrator.state import PostgresStateStore, SqliteStateStore
from tests.postgres import PostgresServer


def _node(name: str) -> NodeRecord:
    return NodeRecord(name, f"{name}:1", NodeState.READY, "runc", 1, 1024, {}, {}, time.time())


@pytest.fixture
def two(postgres: PostgresServer) -> Iterator[tuple[str, PostgresStateStore, PostgresStateStore]]:
    url = postgres.database()
    a, b = PostgresStateStore(url), PostgresStateStore(url)
    try:
        yield url, a, b
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_one_leader_and_a_standby_that_changes_nothing(
    two: tuple[str, PostgresStateStore, PostgresStateStore],
) -> None:
    _, a, b = two
    first, second = a.lease("orchestrator-a"), b.lease("orchestrator-b")
    assert first.try_acquire() and first.held()
    assert not second.try_acquire() and not second.held()
    assert second.leader().startswith("orchestrator-a (term 1, since ")

    a.nodes.upsert(_node("node-1"))
    with pytest.raises(StandingBy, match=r"orchestrator-b\) stands by .* the leader is orchestrator-a"):
        b.nodes.upsert(_node("node-2"))
    assert [n.name for n in b.nodes.all()] == ["node-1"], "the standby reads, and its write left nothing"

    first.release()
    assert second.try_acquire(), "a released lease is free at once"
    assert second.leader().startswith("orchestrator-b (term 2, ")
    b.nodes.upsert(_node("node-2"))
    with pytest.raises(StandingBy):
        a.nodes.upsert(_node("node-3"))


@pytest.mark.timeout(60)
def test_a_leader_cut_off_is_fenced_before_it_notices(
    two: tuple[str, PostgresStateStore, PostgresStateStore],
) -> None:
    url, a, b = two
    first, second = a.lease("orchestrator-a"), b.lease("orchestrator-b")
    assert first.try_acquire()
    # The server ends the leader's lease session, as it does when the leader's host vanishes.
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    assert ended == [(True,)]
    deadline = time.monotonic() + 10
    while not second.try_acquire():
        assert time.monotonic() < deadline, "the standby never took the free lease"
        time.sleep(0.1)
    # The old leader has not looked at its lease yet; its writes are refused all the same.
    with pytest.raises(StandingBy, match="the leader is orchestrator-b"):
        a.nodes.upsert(_node("node-1"))
    assert not first.held(), "and when it looks, it knows"
    assert not first.try_acquire(), "nor can it take the lease back while the new leader lives"
    b.nodes.upsert(_node("node-1"))
    assert [n.name for n in a.nodes.all()] == ["node-1"]


@pytest.mark.timeout(60)
def test_a_leader_is_fenced_by_its_term_even_when_its_backend_pid_comes_back(
    two: tuple[str, PostgresStateStore, PostgresStateStore],
) -> None:
    """Backend pids are reused: the session that took the lease after the old leader's ended
    may get the old one's pid. The stored term tells them apart."""
    url, a, b = two
    first, second = a.lease("orchestrator-a"), b.lease("orchestrator-b")
    assert first.try_acquire() and first.term == 1
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    deadline = time.monotonic() + 10
    while not second.try_acquire():
        assert time.monotonic() < deadline, "the standby never took the free lease"
        time.sleep(0.1)
    assert second.term == 2
    first._pid = second._pid  # the new leader's session got the pid the old one had
    with pytest.raises(StandingBy, match="the leader is orchestrator-b"):
        a.nodes.upsert(_node("node-1"))
    b.nodes.upsert(_node("node-1"))
    assert [n.name for n in a.nodes.all()] == ["node-1"], "the new leader's write alone landed"


@pytest.mark.timeout(30)
def test_the_embedded_store_always_leads(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    try:
        lease = store.lease("local")
        assert lease.try_acquire() and lease.held() and lease.leader() == "local"
        store.nodes.upsert(_node("node-1"))
    finally:
        store.close()
