"""The embedded state store on its own: transitions with their events, request ids, snapshot
records, nodes, and specs read back as stored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.domain import (
    Caller,
    Conflict,
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    InvalidArgument,
    NodeRecord,
    NodeState,
    NotFound,
    Resources,
    RewardSpec,
    Role,
    SnapshotRecord,
    acting_for,
    ids,
)
from orchestrator.state import SqliteStateStore

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStateStore]:
    s = SqliteStateStore(tmp_path / "state.db")
    yield s
    s.close()


def _snapshot(episode_id: str, sequence: int, parent: str = "") -> SnapshotRecord:
    return SnapshotRecord(
        id=ids.snapshot_id(episode_id, sequence), episode_id=episode_id, sequence=sequence, parent_id=parent,
        node="node-1", reason="manual", created_at=1.0, logical_bytes=10, stored_bytes=5, new_bytes=5,
        trajectory_cursor={"turn": 2}, timings_ms={"dump_ms": 1.5},
    )  # fmt: skip


@pytest.mark.timeout(30)
def test_a_submitted_spec_reads_back_exactly_and_each_episode_gets_its_own_address(
    store: SqliteStateStore, tmp_path: Path
) -> None:
    first = store.submit(SPEC, "", POOL)
    second = store.submit(SPEC, "", POOL)
    assert first.spec == SPEC and store.get(first.id).spec == SPEC
    assert ids.SandboxId.parse(ids.sandbox_id(first.id, 1)) == ids.SandboxId(first.id, 1)
    assert first.address != second.address and first.token != second.token
    store.close()
    reopened = SqliteStateStore(tmp_path / "state.db")
    try:
        assert reopened.get(first.id).spec == SPEC
        assert reopened.by_token(first.token) == reopened.get(first.id)
    finally:
        reopened.close()


@pytest.mark.timeout(30)
def test_stored_specs_are_not_validated_again_on_read(store: SqliteStateStore) -> None:
    # Validation runs once, at the API; the store keeps what it was given and returns it as is.
    odd = EpisodeSpec(image="base", command=("true",), env={"1-not-a-name": "x"})
    with pytest.raises(InvalidArgument, match=r"spec\.env"):
        odd.validate()
    e = store.submit(odd, "", POOL)
    assert store.get(e.id).spec.env == {"1-not-a-name": "x"}
    assert [x.id for x in store.query(states=[S.PENDING])] == [e.id]


@pytest.mark.timeout(30)
def test_transitions_follow_the_state_machine_and_commit_with_their_event(store: SqliteStateStore) -> None:
    e = store.submit(SPEC, "", POOL)
    store.transition(e.id, S.RUNNING, "started", node="node-1", run_started_at=100.0)
    with pytest.raises(FailedPrecondition, match="cannot go from RUNNING to RESTORING"):
        store.transition(e.id, S.RESTORING, "no")
    with pytest.raises(FailedPrecondition, match="not PREEMPTED"):
        store.transition(e.id, S.RESTORING, "no", expect=(S.PREEMPTED,))
    snap = _snapshot(e.id, 1)
    after = store.transition(e.id, S.PREEMPTED, "stored", expect=(S.RUNNING,), snapshot=snap, node="")
    assert (after.snapshots, after.last_snapshot_id, after.node) == (1, snap.id, "")
    assert after.run_seconds > 0 and after.run_started_at == 0.0
    assert store.snapshots(e.id) == [snap]
    events = [(ev.from_state, ev.to_state, ev.reason) for ev in store.events(0, [e.id])]
    assert events == [
        ("", "PENDING", "submitted"),
        ("PENDING", "RUNNING", "started"),
        ("RUNNING", "PREEMPTED", "stored"),
    ]
    done = store.transition(e.id, S.CANCELLED, "by user")
    assert done.finished_at > 0
    with pytest.raises(FailedPrecondition):
        store.transition(e.id, S.RUNNING, "too late")


@pytest.mark.timeout(30)
def test_request_ids_return_the_first_episode_and_refuse_another_request(store: SqliteStateStore) -> None:
    first = store.submit(SPEC, "trainer-1", POOL)
    assert store.submit(SPEC, "trainer-1", POOL).id == first.id
    with pytest.raises(Conflict, match="trainer-1"):
        store.submit(EpisodeSpec(image="base", command=("other",)), "trainer-1", POOL)
    assert len(store.query()) == 1


@pytest.mark.timeout(60)
def test_concurrent_submits_share_commits_and_each_is_durable_on_behalf_of_its_own_caller(
    tmp_path: Path,
) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    database = store._database
    commits = []
    notify = database._on_commit
    database._on_commit = lambda: (commits.append(1), notify())[1]
    pool = ids.address_pool("10.9.0.0/22")
    store.submit(SPEC, "taken", pool)
    other = EpisodeSpec(image="base", command=("other",))
    start = threading.Barrier(24)

    def submit(i: int) -> Episode | Exception:
        with acting_for(Caller(f"trainer-{i}", Role.TRAINER)):
            start.wait()
            try:
                # Every sixth reuses a request id for another spec: refused, and alone.
                return store.submit(other if i % 6 == 0 else SPEC, "taken" if i % 6 == 0 else f"r{i}", pool)
            except Conflict as exc:
                return exc

    with ThreadPoolExecutor(24) as threads:
        outcomes = list(threads.map(submit, range(24)))
    store.close()
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, Conflict)]
    assert refused == [0, 6, 12, 18]
    accepted = {i: o for i, o in enumerate(outcomes) if isinstance(o, Episode)}
    assert len({e.address for e in accepted.values()}) == len({e.id for e in accepted.values()}) == 20
    assert len(commits) < 1 + 20, "no two submits shared a commit"

    reopened = SqliteStateStore(tmp_path / "state.db")
    try:
        events = {e.episode_id: e for e in reopened.events() if e.to_state == S.PENDING}
        for i, episode in accepted.items():
            assert reopened.get(episode.id).address == episode.address
            assert events[episode.id].actor == f"trainer-{i} (trainer)"
        assert len(reopened.query()) == 21
    finally:
        reopened.close()


@pytest.mark.timeout(30)
def test_the_address_pool_runs_out_with_a_clear_error(store: SqliteStateStore) -> None:
    for _ in range(POOL.num_addresses - 2):  # a /29 has six host addresses
        store.submit(SPEC, "", POOL)
    with pytest.raises(FailedPrecondition, match=r"address pool 10\.9\.0\.0/29 is exhausted"):
        store.submit(SPEC, "", POOL)


@pytest.mark.timeout(30)
def test_nodes_keep_a_drain_across_registration_and_unknown_ones_are_not_found(
    store: SqliteStateStore,
) -> None:
    node = NodeRecord(
        "node-1", "127.0.0.1:1", NodeState.READY, "runc", 2, 4096, {"sha256:a": ["base"]}, {}, 0
    )
    store.upsert_node(node)
    store.set_node_state("node-1", NodeState.DRAINING, "drain requested")
    assert store.upsert_node(node).state == NodeState.DRAINING
    assert store.node("node-1").has_image("base") and store.node("node-1").has_image("sha256:a")
    with pytest.raises(NotFound, match="node-9"):
        store.node("node-9")
