"""`stasis state migrate`: an orchestrator's SQLite state copied whole into PostgreSQL, or not at
all, and read back there exactly as the embedded store and ledger held it."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import Orchestrator, OrchestratorSettings, migrate_to_postgres
from orchestrator.cli import main
from orchestrator.domain import (
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    ImageRecord,
    NodeRecord,
    NodeState,
)
from orchestrator.state import PostgresStateStore, SqliteStateStore, StateDirLock, StateStore
from orchestrator.trajectory import Ledger, Verification
from tests.orchestrator.test_ledger import BYTES, _chat, _record
from tests.orchestrator.test_state_store import POOL, SPEC, _snapshot
from tests.postgres import PostgresServer


def _fill(state_db: Path) -> None:
    """A state file with a little of everything an orchestrator keeps."""
    store = SqliteStateStore(state_db)
    first = store.episodes.submit(SPEC, "trainer-1", POOL)
    second = store.episodes.submit(
        EpisodeSpec(image="base", command=("true",), labels={"team": "b"}), "", POOL
    )
    store.episodes.transition(first.id, EpisodeState.RUNNING, "started", node="node-1", run_started_at=100.0)
    store.episodes.update(
        first.id, decision="pinned by hand", pinned_node="node-1", reward=0.5, log_offsets=(0, 7)
    )
    store.snapshots.add(_snapshot(first.id, 1), snapshots=1)
    store.episodes.transition(second.id, EpisodeState.CANCELLED, "by hand")
    store.nodes.upsert(
        NodeRecord(
            "node-1", "10.0.0.1:7000", NodeState.READY, "runc", 4, 1024, {"sha256:aa": ["base"]}, {}, 1.0
        )
    )
    store.images.put(ImageRecord("tool", "r@sha256:aa", "sha256:bb", 10, "/src", 1.0))
    store.logs.put(first.id, 4096, b"log\x00\xff")
    store.requests.remember("op-1", "CancelEpisode", {"id": second.id}, second.id)
    store.close()
    ledger = Ledger.sqlite(state_db)
    _record(ledger, _chat("hi"), "hello", episode_id=first.id)
    _record(ledger, _chat("hi", "hello", "more"), "done", episode_id=first.id)
    ledger.verifications.record(first.id, Verification(0.75, 3, False, BYTES, 812.25))
    ledger.policy.publish(2)
    ledger.policy.publish(5)
    ledger.close()


def _state(store: StateStore, ledger: Ledger) -> dict[str, object]:
    episodes = store.episodes.query()
    return {
        "episodes": episodes,
        "events": store.events.read(0, limit=1000),
        "snapshots": [store.snapshots.of(e.id) for e in episodes],
        "nodes": store.nodes.all(),
        "images": store.images.all(),
        "logs": [store.logs.get(e.id) for e in episodes],
        "request": store.requests.known("op-1", "CancelEpisode", {"id": episodes[1].id}),
        "turns": [ledger.turns(e.id) for e in episodes],
        "verifications": [ledger.verifications.get(e.id) for e in episodes],
        "policy": ledger.policy.current(),
    }


@pytest.mark.timeout(60)
def test_the_whole_state_moves_to_postgresql_and_carries_on_there(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    _fill(tmp_path / "state.db")
    sqlite_store, sqlite_ledger = (
        SqliteStateStore(tmp_path / "state.db"),
        Ledger.sqlite(tmp_path / "state.db"),
    )
    before = _state(sqlite_store, sqlite_ledger)
    sqlite_store.close()
    sqlite_ledger.close()

    url = postgres.database()
    out, err = io.StringIO(), io.StringIO()
    assert main(["state", "migrate", "--state-dir", str(tmp_path), "--database-url", url], out, err) == 0, (
        err.getvalue()
    )
    rows = dict(line.split() for line in out.getvalue().splitlines()[1:])
    assert rows["episodes"] == "2" and rows["turns"] == "2" and rows["verifications"] == "1"
    assert rows["policy_versions"] == "2"
    assert int(rows["events"]) == len(before["events"])  # type: ignore[arg-type]

    store = PostgresStateStore(url)
    try:
        ledger = Ledger.postgres(store.database)
        assert _state(store, ledger) == before
        assert store.episodes.submit(SPEC, "trainer-1", POOL).id == before["episodes"][0].id  # type: ignore[index]
        # New rows follow the copied ones: events keep their order, turns their ids.
        later = store.episodes.submit(SPEC, "trainer-2", POOL)
        assert store.events.read(0, [later.id])[0].seq > before["events"][-1].seq  # type: ignore[index]
        episode = before["episodes"][0].id  # type: ignore[index]
        turn = _record(ledger, _chat("again"), "yes", episode_id=episode)
        assert turn.id > max(t.id for t in before["turns"][0])  # type: ignore[index]
    finally:
        store.close()

    with pytest.raises(FailedPrecondition, match="already holds episodes"):
        migrate_to_postgres(tmp_path / "state.db", url)
    store = PostgresStateStore(url)
    assert len(store.episodes.query()) == 3, "a refused migration wrote nothing"
    store.close()


@pytest.mark.timeout(60)
def test_a_text_postgresql_cannot_hold_or_a_missing_file_moves_nothing(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.database()
    with pytest.raises(FailedPrecondition, match="there is no state file"):
        migrate_to_postgres(tmp_path / "state.db", url)

    _fill(tmp_path / "state.db")
    with sqlite3.connect(tmp_path / "state.db") as db:  # as an older Stasis could have stored
        db.execute("UPDATE nodes SET address = ?", ("node\x00-1",))
    with pytest.raises(FailedPrecondition, match=r"nodes\.address of the row name='node-1' holds a NUL"):
        migrate_to_postgres(tmp_path / "state.db", url)
    store = PostgresStateStore(url)
    assert store.episodes.query() == [] and store.nodes.all() == [], "the episodes copied first were kept"
    store.close()


@pytest.mark.timeout(60)
def test_nothing_moves_while_an_orchestrator_runs_on_the_state_dir(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.database()
    _fill(tmp_path / "state.db")
    running = Orchestrator(OrchestratorSettings(state_dir=tmp_path, listen="127.0.0.1:0")).start(
        gateway=False
    )
    try:
        with pytest.raises(
            FailedPrecondition, match=rf"the state dir {tmp_path} is in use by an orchestrator \(pid "
        ):
            migrate_to_postgres(tmp_path / "state.db", url)
        store = PostgresStateStore(url)
        assert store.episodes.query() == [], "nothing was copied"
        store.close()
    finally:
        running.stop()
    assert sum(migrate_to_postgres(tmp_path / "state.db", url).values()) > 0, "once it stopped, it moves"
    with pytest.raises(FailedPrecondition, match="in use by stasis state migrate") as refused:
        owner = StateDirLock(tmp_path, "stasis state migrate")
        try:
            Orchestrator(OrchestratorSettings(state_dir=tmp_path, listen="127.0.0.1:0"))
        finally:
            owner.release()
    assert "stop it first" in str(refused.value)
