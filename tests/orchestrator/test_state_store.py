"""The state stores on their own, the embedded SQLite one and the PostgreSQL one held to the
same tests: transitions with their events, request ids, snapshot records, nodes, images and
logs, specs read back as stored, and what concurrent callers and watchers see.

The PostgreSQL store runs against a real server the suite starts (`tests/postgres.py`), with a
fresh database for each test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from orchestrator.domain import (
    Caller,
    Conflict,
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    Group,
    ImageRecord,
    InvalidArgument,
    NodeRecord,
    NodeState,
    NotFound,
    Preemption,
    Resources,
    RewardSpec,
    Role,
    SnapshotRecord,
    TemporaryError,
    acting_for,
    ids,
)
from orchestrator.state import PostgresStateStore, SqliteStateStore, StateStore
from tests.postgres import PASSWORD, PostgresServer

S = EpisodeState
POOL = ids.address_pool("10.9.0.0/29")
SPEC = EpisodeSpec(
    image="base",
    command=("python3", "agent.py"),
    env={"MODE": "eval"},
    files={"/task.txt": b"fix the bug\n", "/blob.bin": bytes(range(256))},
    resources=Resources(cpus=0.5),
    labels={"suite": "unit"},
    reward=RewardSpec(command=("python3", "/grade.py"), files={"/grade.py": b"print(1)"}),
)

OpenStore = Callable[[], StateStore]


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens a store on this test's own database. Each call opens it anew, as an orchestrator
    that restarted would; every store opened is closed at the end."""
    server: PostgresServer | None = (
        request.getfixturevalue("postgres") if request.param == "postgres" else None
    )
    url = server.database() if server else ""
    opened: list[StateStore] = []

    def open_() -> StateStore:
        opened.append(PostgresStateStore(url) if url else SqliteStateStore(tmp_path / "state.db"))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()
    if server:
        server.drop(url)


@pytest.fixture
def store(open_store: OpenStore) -> StateStore:
    return open_store()


def _snapshot(episode_id: str, sequence: int, parent: str = "") -> SnapshotRecord:
    return SnapshotRecord(
        id=ids.snapshot_id(episode_id, sequence), episode_id=episode_id, sequence=sequence, parent_id=parent,
        node="node-1", reason="manual", created_at=1.0, logical_bytes=10, stored_bytes=5, new_bytes=5,
        trajectory_cursor={"turn": 2}, timings_ms={"dump_ms": 1.5},
    )  # fmt: skip


def _later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


@pytest.mark.timeout(30)
def test_a_submitted_spec_reads_back_exactly_and_each_episode_gets_its_own_address(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first = store.episodes.submit(SPEC, "", POOL)
    second = store.episodes.submit(SPEC, "", POOL)
    assert first.spec == SPEC and store.episodes.get(first.id).spec == SPEC
    assert ids.SandboxId.parse(ids.sandbox_id(first.id, 1)) == ids.SandboxId(first.id, 1)
    assert first.address != second.address and first.token != second.token
    store.close()
    reopened = open_store()
    assert reopened.episodes.get(first.id).spec == SPEC
    assert reopened.episodes.by_token(first.token) == reopened.episodes.get(first.id)
    assert reopened.episodes.by_token("no-such-token") is None


@pytest.mark.timeout(30)
def test_stored_specs_are_not_validated_again_on_read(store: StateStore) -> None:
    # Validation runs once, at the API; the store keeps what it was given and returns it as is.
    odd = EpisodeSpec(image="base", command=("true",), env={"1-not-a-name": "x"})
    with pytest.raises(InvalidArgument, match=r"spec\.env"):
        odd.validate()
    e = store.episodes.submit(odd, "", POOL)
    assert store.episodes.get(e.id).spec.env == {"1-not-a-name": "x"}
    assert [x.id for x in store.episodes.query(states=[S.PENDING])] == [e.id]


@pytest.mark.timeout(30)
def test_transitions_follow_the_state_machine_and_commit_with_their_event(store: StateStore) -> None:
    e = store.episodes.submit(SPEC, "", POOL)
    store.episodes.transition(e.id, S.RUNNING, "started", node="node-1", run_started_at=100.0)
    with pytest.raises(FailedPrecondition, match="cannot go from RUNNING to RESTORING"):
        store.episodes.transition(e.id, S.RESTORING, "no")
    with pytest.raises(FailedPrecondition, match="not PREEMPTED"):
        store.episodes.transition(e.id, S.RESTORING, "no", expect=(S.PREEMPTED,))
    with pytest.raises(NotFound, match="ep-missing"):
        store.episodes.transition("ep-missing", S.RUNNING, "no")
    snap = _snapshot(e.id, 1)
    after = store.episodes.transition(
        e.id, S.PREEMPTED, "stored", expect=(S.RUNNING,), snapshot=snap, node=""
    )
    assert (after.snapshots, after.last_snapshot_id, after.node) == (1, snap.id, "")
    assert after.run_seconds > 0 and after.run_started_at == 0.0
    assert store.snapshots.of(e.id) == [snap]
    events = [(ev.from_state, ev.to_state, ev.reason) for ev in store.events.read(0, [e.id])]
    assert events == [
        ("", "PENDING", "submitted"),
        ("PENDING", "RUNNING", "started"),
        ("RUNNING", "PREEMPTED", "stored"),
    ]
    done = store.episodes.transition(e.id, S.CANCELLED, "by user")
    assert done.finished_at > 0
    with pytest.raises(FailedPrecondition):
        store.episodes.transition(e.id, S.RUNNING, "too late")


@pytest.mark.timeout(30)
def test_fields_read_back_as_written_and_a_decision_becomes_an_event(store: StateStore) -> None:
    e = store.episodes.submit(SPEC, "", POOL)
    other = store.episodes.submit(
        EpisodeSpec(image="base", command=("true",), labels={"suite": "other"}), "", POOL
    )
    changed = store.episodes.update(
        e.id, decision="pinned by hand", held=True, pinned_node="node-2", log_offsets=(0, -1, 7),
        exit_code=3, reward=0.25, attempts=2, not_before=12.5, node="node-2",
    )  # fmt: skip
    assert changed == store.episodes.get(e.id)
    assert (changed.held, changed.pinned_node, changed.log_offsets) == (True, "node-2", (0, -1, 7))
    assert (changed.exit_code, changed.reward, changed.attempts, changed.not_before) == (3, 0.25, 2, 12.5)
    assert store.episodes.update(e.id, held=False, exit_code=None, reward=None).held is False
    assert (store.episodes.get(e.id).exit_code, store.episodes.get(e.id).reward) == (None, None)
    last = store.events.read(0, [e.id])[-1]
    assert (last.kind, last.reason) == ("decision", "pinned by hand")
    with pytest.raises(ValueError, match="not_a_field"):
        store.episodes.update(e.id, not_a_field=1)
    with pytest.raises(NotFound):
        store.episodes.update("ep-missing", held=True)
    with pytest.raises(FailedPrecondition, match=f"episode {e.id} is PENDING, not PREEMPTED"):
        store.episodes.update(e.id, held=True, expect=(S.PREEMPTED,))
    assert store.episodes.get(e.id).held is False, (
        "an update whose state is not the expected one changes nothing"
    )
    assert store.episodes.update(e.id, held=True, expect=(S.PENDING,)).held is True
    store.episodes.update(e.id, held=False)

    assert [x.id for x in store.episodes.query(node="node-2")] == [e.id]
    assert [x.id for x in store.episodes.query(labels={"suite": "other"})] == [other.id]
    assert [x.id for x in store.episodes.query(states=[S.RUNNING, S.PENDING])] == [e.id, other.id]
    assert store.episodes.query(states=[S.RUNNING]) == []
    assert [ev.episode_id for ev in store.events.read(0, [other.id])] == [other.id]
    first, second = store.events.read(limit=2)
    assert second.seq > first.seq and [ev.seq for ev in store.events.read(first.seq, limit=1)] == [second.seq]


@pytest.mark.timeout(30)
def test_request_ids_return_the_first_episode_and_refuse_another_request(store: StateStore) -> None:
    first = store.episodes.submit(SPEC, "trainer-1", POOL)
    assert store.episodes.submit(SPEC, "trainer-1", POOL).id == first.id
    with pytest.raises(Conflict, match="trainer-1"):
        store.episodes.submit(EpisodeSpec(image="base", command=("other",)), "trainer-1", POOL)
    assert len(store.episodes.query()) == 1
    with pytest.raises(InvalidArgument, match="request_id"):
        store.episodes.submit(SPEC, "x" * 201, POOL)

    assert store.requests.known("cancel-1", "CancelEpisode", {"id": first.id}) is None
    store.requests.remember("cancel-1", "CancelEpisode", {"id": first.id}, first.id)
    store.requests.remember("cancel-1", "CancelEpisode", {"id": first.id}, first.id)  # a retry
    assert store.requests.known("cancel-1", "CancelEpisode", {"id": first.id}) == first.id
    with pytest.raises(Conflict, match="different CancelEpisode request"):
        store.requests.known("cancel-1", "CancelEpisode", {"id": "ep-other"})
    with pytest.raises(Conflict):
        store.requests.remember("trainer-1", "CancelEpisode", {"id": first.id}, first.id)


@pytest.mark.timeout(30)
def test_a_batch_of_submits_is_stored_whole_or_not_at_all(open_store: OpenStore) -> None:
    store = open_store()
    taken = store.episodes.submit(SPEC, "taken", POOL)
    other = EpisodeSpec(image="base", command=("other",))
    with pytest.raises(Conflict, match="taken"):
        store.episodes.submit_many([(SPEC, "a"), (SPEC, "b"), (other, "taken")], POOL)
    with pytest.raises(FailedPrecondition, match="exhausted"):
        store.episodes.submit_many([(SPEC, f"c{i}") for i in range(POOL.num_addresses - 2)], POOL)
    assert [e.id for e in store.episodes.query()] == [taken.id]
    assert [e.episode_id for e in store.events.read()] == [taken.id]
    assert store.requests.known("a", "SubmitEpisode", {}) is None

    batch = store.episodes.submit_many([(SPEC, "a"), (other, "b"), (SPEC, "taken")], POOL)
    assert batch[2].id == taken.id and len({e.address for e in batch}) == 3
    store.close()
    assert [e.id for e in open_store().episodes.query()] == [taken.id, batch[0].id, batch[1].id]


@pytest.mark.timeout(60)
def test_concurrent_submits_are_each_durable_on_behalf_of_their_own_caller(open_store: OpenStore) -> None:
    store = open_store()
    pool = ids.address_pool("10.9.0.0/22")
    store.episodes.submit(SPEC, "taken", pool)
    other = EpisodeSpec(image="base", command=("other",))
    start = threading.Barrier(24)

    def submit(i: int) -> Episode | Exception:
        with acting_for(Caller(f"trainer-{i}", Role.TRAINER)):
            start.wait()
            try:
                # Every sixth reuses a request id for another spec: refused, and alone. The
                # others come in pairs that send the same request at once: one episode each.
                rid = "taken" if i % 6 == 0 else f"r{i // 2}"
                return store.episodes.submit(other if i % 6 == 0 else SPEC, rid, pool)
            except Conflict as exc:
                return exc

    with ThreadPoolExecutor(24) as threads:
        outcomes = list(threads.map(submit, range(24)))
    store.close()
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, Conflict)]
    assert refused == [0, 6, 12, 18]
    accepted = {i: o for i, o in enumerate(outcomes) if isinstance(o, Episode)}
    episodes = {e.id: e for e in accepted.values()}
    assert len(episodes) == len({e.address for e in episodes.values()}) == len({i // 2 for i in accepted})
    assert all(accepted[i].id == accepted[i ^ 1].id for i in accepted if i ^ 1 in accepted)

    reopened = open_store()
    events = {e.episode_id: e for e in reopened.events.read() if e.to_state == S.PENDING}
    for episode_id, episode in episodes.items():
        assert reopened.episodes.get(episode_id).address == episode.address
        submitters = {f"trainer-{i} (trainer)" for i, o in accepted.items() if o.id == episode_id}
        assert events[episode_id].actor in submitters
    assert len(reopened.episodes.query()) == 1 + len(episodes)


@pytest.mark.timeout(60)
def test_concurrent_submits_share_commits(open_store: OpenStore) -> None:
    store = open_store()
    group = store._database._group  # type: ignore[attr-defined]
    commits = []
    commit = group._commit
    group._commit = lambda batch: (commits.append(len(batch)), commit(batch))[1]
    pool = ids.address_pool("10.9.0.0/22")
    start = threading.Barrier(24)

    def submit(i: int) -> Episode:
        start.wait()
        return store.episodes.submit(SPEC, f"r{i}", pool)

    try:
        with ThreadPoolExecutor(24) as threads:
            assert len({e.id for e in threads.map(submit, range(24))}) == 24
    finally:
        store.close()
    assert sum(commits) == 24 and len(commits) < 24, f"no two submits shared a commit: {commits}"
    assert len(open_store().episodes.query()) == 24


@pytest.mark.timeout(60)
def test_concurrent_changes_to_one_episode_are_neither_lost_nor_doubled(open_store: OpenStore) -> None:
    # Through two stores on one database, as well as through one: the writers take turns in the
    # database, not only in this process.
    stores = [open_store(), open_store()]
    store = stores[0]
    e = store.episodes.submit(SPEC, "", POOL)
    start = threading.Barrier(16)

    def start_it(i: int) -> Episode | FailedPrecondition:
        start.wait()
        try:
            return stores[i % 2].episodes.transition(
                e.id, S.RUNNING, f"placed {i}", expect=(S.PENDING,), node=f"node-{i}"
            )
        except FailedPrecondition as exc:
            return exc

    def autosave(i: int) -> Episode:
        start.wait()
        return stores[i % 2].snapshots.add(_snapshot(e.id, i + 1))

    with ThreadPoolExecutor(16) as threads:
        started = [o for o in threads.map(start_it, range(16)) if isinstance(o, Episode)]
        list(threads.map(autosave, range(16)))
    assert len(started) == 1 and store.episodes.get(e.id).node == started[0].node
    assert [ev.reason for ev in store.events.read(0, [e.id]) if ev.to_state == S.RUNNING][:1] == [
        started[0].reason
    ]
    assert len([ev for ev in store.events.read(0, [e.id]) if ev.kind == "transition"]) == 2
    assert store.episodes.get(e.id).snapshots == len(store.snapshots.of(e.id)) == 16


@pytest.mark.timeout(30)
def test_watchers_wake_when_an_event_commits_and_when_the_store_closes(store: StateStore) -> None:
    e = store.episodes.submit(SPEC, "", POOL)
    last = store.events.read()[-1].seq
    assert store.events.wait(last - 1, timeout=0)
    began = time.monotonic()
    assert not store.events.wait(last, timeout=0.3)
    assert time.monotonic() - began >= 0.3

    waker = _later(0.3, lambda: store.episodes.update(e.id, decision="looked at"))
    began = time.monotonic()
    assert store.events.wait(last, timeout=20)
    assert time.monotonic() - began < 10, "the watcher slept through the commit"
    waker.join()
    assert [ev.reason for ev in store.events.read(last)] == ["looked at"]

    closer = _later(0.3, store.close)
    began = time.monotonic()
    assert store.events.wait(last + 1, timeout=20) and store.closed
    assert time.monotonic() - began < 10, "the watcher slept through the close"
    closer.join()


@pytest.mark.timeout(30)
def test_the_address_pool_runs_out_with_a_clear_error_and_a_finished_episode_frees_its_address(
    store: StateStore,
) -> None:
    episodes = [store.episodes.submit(SPEC, "", POOL) for _ in range(POOL.num_addresses - 2)]  # a /29 has six
    with pytest.raises(FailedPrecondition, match=r"address pool 10\.9\.0\.0/29 is exhausted"):
        store.episodes.submit(SPEC, "", POOL)
    store.episodes.transition(episodes[2].id, S.CANCELLED, "by user")
    assert store.episodes.submit(SPEC, "", POOL).address == episodes[2].address


@pytest.mark.timeout(30)
def test_the_queue_in_order_a_page_at_a_time_what_runs_on_nodes_and_what_ended_when(
    store: StateStore,
) -> None:
    pool = ids.address_pool("10.9.0.0/24")
    low, high = (replace(SPEC, preemption=Preemption(priority=p)) for p in (0, 5))
    tied = [store.episodes.submit(low, "", pool) for _ in range(3)]
    urgent = store.episodes.submit(high, "", pool)
    for e in tied:  # the same moment: the id decides, across a page's end too
        store.episodes.update(e.id, queued_at=tied[0].queued_at)
    running = store.episodes.submit(high, "", pool)
    store.episodes.transition(running.id, S.RUNNING, "started", node="node-1", run_started_at=1.0)
    starting = store.episodes.submit(low, "", pool)
    store.episodes.update(starting.id, node="node-1")
    preempted, held = (store.episodes.submit(high, "", pool) for _ in range(2))
    for e in (preempted, held):
        store.episodes.transition(e.id, S.RUNNING, "started", node="node-1", run_started_at=1.0)
    store.episodes.transition(preempted.id, S.PREEMPTED, "time slice", node="", queued_at=time.time() + 1)
    store.episodes.transition(held.id, S.PREEMPTED, "by hand", node="", held=True)
    backing_off = store.episodes.submit(high, "", pool)
    store.episodes.update(backing_off.id, not_before=time.time() + 60)
    cancelled = store.episodes.submit(high, "", pool)
    store.episodes.transition(cancelled.id, S.CANCELLED, "by user")

    now = time.time() + 2
    in_order = [urgent.id, preempted.id, *sorted(e.id for e in tied)]
    for page in (1, 2, 256):
        assert [e.id for e in store.episodes.queue(now, page=page)] == in_order
    # Its back-off over, it waits from when it was submitted: before the preempted one was requeued.
    assert [e.id for e in store.episodes.queue(now + 60)] == [urgent.id, backing_off.id, *in_order[1:]]
    # What is on a node is read apart, by node or all at once; the queue, the held and the
    # finished are not.
    assert [e.id for e in store.episodes.on_nodes()] == [running.id, starting.id]
    assert [e.id for e in store.episodes.on_nodes("node-1")] == [running.id, starting.id]
    assert store.episodes.on_nodes("node-2") == []
    before = time.time()
    store.episodes.transition(running.id, S.SUCCEEDED, "exited 0")
    assert [e.id for e in store.episodes.on_nodes()] == [starting.id]
    # The ended, by when they ended: what retention asks.
    assert set(store.episodes.ended_before(time.time() + 1)) == {cancelled.id, running.id}
    assert store.episodes.ended_before(before) == [cancelled.id]


@pytest.mark.timeout(30)
def test_nodes_keep_a_drain_across_registration_and_unknown_ones_are_not_found(store: StateStore) -> None:
    node = NodeRecord(
        "node-1", "127.0.0.1:1", NodeState.READY, "runc", 2, 4096, {"sha256:a": ["base"]}, {}, 0
    )
    store.nodes.upsert(node)
    store.nodes.set_state("node-1", NodeState.DRAINING, "drain requested")
    assert store.nodes.upsert(node).state == NodeState.DRAINING
    assert store.nodes.get("node-1").has_image("base") and store.nodes.get("node-1").has_image("sha256:a")
    with pytest.raises(NotFound, match="node-9"):
        store.nodes.get("node-9")
    with pytest.raises(NotFound, match="node-9"):
        store.nodes.set_state("node-9", NodeState.CORDONED, "no")
    seen = len(store.events.read())
    store.nodes.set_state("node-1", NodeState.DRAINING, "again")
    assert len(store.events.read()) == seen, "a state it already had is no event"
    store.nodes.set_images("node-1", {"sha256:b": ["other"]})
    store.nodes.upsert(
        NodeRecord("node-0", "127.0.0.1:2", NodeState.READY, "docker", 1, 1024, {}, {"z": "1"}, 5)
    )
    assert [(n.name, n.state, n.images) for n in store.nodes.all()] == [
        ("node-0", NodeState.READY, {}),
        ("node-1", NodeState.DRAINING, {"sha256:b": ["other"]}),
    ]
    assert [(ev.kind, ev.to_state, ev.node) for ev in store.events.read()][-1] == ("node", "READY", "node-0")


@pytest.mark.timeout(30)
def test_logs_and_images_are_kept_replaced_and_removed(store: StateStore) -> None:
    assert store.logs.get("ep-1") is None
    store.logs.put("ep-1", 0, b"first\x00\xff")
    store.logs.put("ep-1", 4096, b"tail")
    assert store.logs.get("ep-1") == (4096, b"tail")

    image = ImageRecord("tool", "127.0.0.1:5000/tool@sha256:aa", "sha256:bb", 10, "/src", 1.0)
    store.images.put(image)
    store.images.put(ImageRecord("base", "r", "d", 1, "s", 2.0))
    newer = ImageRecord("tool", "127.0.0.1:5000/tool@sha256:cc", "sha256:dd", 20, "/src", 3.0)
    store.images.put(newer)
    assert [i.name for i in store.images.all()] == ["base", "tool"] and store.images.get("tool") == newer
    assert store.images.delete("tool") == newer and store.images.get("tool") is None
    with pytest.raises(NotFound, match="imported images: base"):
        store.images.delete("tool")


@pytest.mark.timeout(30)
def test_postgres_errors_name_the_database_but_never_its_password(postgres: PostgresServer) -> None:
    with pytest.raises(InvalidArgument, match="database_url"):
        PostgresStateStore("mysql://stasis:secret@127.0.0.1/stasis")
    url = postgres.database()
    try:
        store = PostgresStateStore(url)
        store.close()
        assert store.where == f"postgresql://stasis@127.0.0.1:{postgres.port}/{url.rsplit('/', 1)[1]}"
        for wrong, secret in (
            (url.replace(f":{postgres.port}/", ":1/"), PASSWORD),
            (url.replace("-Not", "-Nope"), "-Nope"),
        ):
            with pytest.raises(TemporaryError) as refused:
                PostgresStateStore(wrong)
            assert "127.0.0.1" in str(refused.value)
            assert secret not in str(refused.value) and quote(secret, safe="") not in str(refused.value)
    finally:
        postgres.drop(url)


@pytest.mark.timeout(60)
def test_the_postgres_store_carries_on_after_the_server_drops_its_connections(
    postgres: PostgresServer,
) -> None:
    url = postgres.database()
    store = PostgresStateStore(url)
    try:
        e = store.episodes.submit(SPEC, "", POOL)
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (url.rsplit("/", 1)[1],),
            )
        assert store.episodes.get(e.id).id == e.id
        last = store.events.read()[-1].seq
        waker = _later(0.5, lambda: store.episodes.update(e.id, decision="after the outage"))
        began = time.monotonic()
        assert store.events.wait(last, timeout=20)
        assert time.monotonic() - began < 10, "the watcher slept through the commit"
        waker.join()
    finally:
        store.close()
        postgres.drop(url)


@pytest.mark.timeout(60)
def test_a_postgres_database_of_an_earlier_release_gets_the_indexes_added_since(
    postgres: PostgresServer,
) -> None:
    """An earlier release made the tables without the indexes added since (`ADDED_INDEXES`), and
    another's build of one was cut short (PostgreSQL leaves such an index invalid, and never reads
    it). Opening the store builds the missing one and builds the invalid one again."""
    from orchestrator.state.postgres_schema import ADDED_INDEXES

    url = postgres.database()
    try:
        store = PostgresStateStore(url)
        waiting = [store.episodes.submit(SPEC, "", POOL) for _ in range(3)]
        store.close()
        with psycopg.connect(postgres.url(url.rsplit("/", 1)[1]), autocommit=True) as db:
            db.execute("DROP INDEX episodes_queue")
            db.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'episodes_ended'::regclass")
        store = PostgresStateStore(url)
        try:
            assert [e.id for e in store.episodes.queue(time.time())] == [e.id for e in waiting]
        finally:
            store.close()
        with psycopg.connect(postgres.url(url.rsplit("/", 1)[1]), autocommit=True) as db:
            rows = db.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = ANY(%s)",
                ([name for name, _ in ADDED_INDEXES],),
            ).fetchall()
        assert sorted(rows) == sorted((name, True) for name, _ in ADDED_INDEXES)
    finally:
        postgres.drop(url)


@pytest.mark.timeout(60)
def test_snapshots_recorded_before_manifests_were_digested_read_back_with_none(
    open_store: OpenStore,
) -> None:
    """Issue 45, F8: a database from before snapshots recorded their manifest's digest gains the
    column when an orchestrator opens it; its snapshots read back with none (never restored), and
    new ones keep theirs."""
    store = open_store()
    episode_id = store.episodes.submit(SPEC, "", POOL).id
    store.snapshots.add(_snapshot(episode_id, 1))
    drop = "ALTER TABLE snapshots DROP COLUMN manifest_digest"  # as the older schema had it
    if isinstance(store, SqliteStateStore):
        store._database.db.execute(drop)  # Test seam: the database under the store.
    else:
        assert isinstance(store, PostgresStateStore)
        with store.database.tx() as db:
            db.execute(drop)
    store.close()

    reopened = open_store()
    (old,) = reopened.snapshots.of(episode_id)
    assert old.manifest_digest == ""
    digest = "sha256:" + "ab" * 32
    reopened.snapshots.add(replace(_snapshot(episode_id, 2, old.id), manifest_digest=digest))
    assert [s.manifest_digest for s in reopened.snapshots.of(episode_id)] == ["", digest]


@pytest.mark.timeout(60)
def test_a_group_and_its_members_indexes_are_kept_across_a_reopened_store(open_store: OpenStore) -> None:
    store = open_store()
    group = Group("g-1", "task-7", 3, max_staleness=2)
    members = store.episodes.submit_many([(SPEC, "m0"), (SPEC, "m1"), (SPEC, "m2")], POOL, group)
    alone = store.episodes.submit(SPEC, "", POOL)
    assert [(e.group_id, e.group_index) for e in members] == [("g-1", 0), ("g-1", 1), ("g-1", 2)]
    assert (alone.group_id, alone.group_index) == ("", 0)
    store.close()

    reopened = open_store()
    (kept,) = reopened.groups.all()
    assert replace(kept, created_at=0.0) == group and kept.created_at > 0
    assert reopened.groups.get("g-1") == kept
    assert [(e.id, e.group_index) for e in reopened.groups.members("g-1")] == [
        (e.id, i) for i, e in enumerate(members)
    ]
    assert reopened.episodes.get(members[1].id).group_id == "g-1"
    assert [
        e.id for e in reopened.episodes.submit_many([(SPEC, "m0"), (SPEC, "m1"), (SPEC, "m2")], POOL, group)
    ] == [e.id for e in members], "a retry of the group returns its members"
    with pytest.raises(NotFound, match="group 'nope'"):
        reopened.groups.get("nope")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("group", "field"),
    [
        (Group("g-1", "task-7", 2), "group.size"),
        (Group("g-1", "task-8", 3), "group.task_id"),
        (Group("g-1", "task-7", 3, max_staleness=1), "group.max_staleness"),
        (Group("g-1", "task-7", 3), "group.id"),  # new members of a group that has them all
    ],
)
def test_a_group_id_taken_by_another_group_is_refused_naming_the_field_and_nothing_is_stored(
    store: StateStore, group: Group, field: str
) -> None:
    store.episodes.submit_many([(SPEC, "")] * 3, POOL, Group("g-1", "task-7", 3))
    stored, events = store.episodes.query(), store.events.read()
    with pytest.raises(InvalidArgument) as err:
        store.episodes.submit_many([(SPEC, "")] * group.size, POOL, group)
    assert err.value.field == field, err.value
    assert store.episodes.query() == stored and store.events.read() == events


@pytest.mark.timeout(60)
def test_a_database_from_before_groups_gains_them_and_its_episodes_are_in_none(open_store: OpenStore) -> None:
    store = open_store()
    old = store.episodes.submit(SPEC, "", POOL)
    # As the older schema had it: no group columns, no table of groups.
    if isinstance(store, SqliteStateStore):
        for statement in (
            "DROP INDEX episodes_group",
            "ALTER TABLE episodes DROP COLUMN group_id",
            "ALTER TABLE episodes DROP COLUMN group_index",
            "DROP TABLE episode_groups",
        ):
            store._database.db.execute(statement)  # Test seam: the database under the store.
    else:
        assert isinstance(store, PostgresStateStore)
        with store.database.tx() as db:
            db.execute("ALTER TABLE episodes DROP COLUMN group_id, DROP COLUMN group_index")
            db.execute("DROP TABLE episode_groups")
    store.close()

    reopened = open_store()
    assert (reopened.episodes.get(old.id).group_id, reopened.episodes.get(old.id).group_index) == ("", 0)
    (member,) = reopened.episodes.submit_many([(SPEC, "")], POOL, Group("g-1", "task-7", 1))
    assert reopened.groups.members("g-1") == [member] and member.group_id == "g-1"
