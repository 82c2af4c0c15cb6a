"""Each part of the control loop in-process: real state store, real snapshot store, and node
agents replaced by the boundary fake in `fakes` (no containers run here; the real agents are
exercised by the end-to-end tests)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from orchestrator.api.service import StasisService
from orchestrator.control import AgentUnavailable, Control, ControlSettings, SnapshotTarget, SpecRefused
from orchestrator.control.node_agent import SandboxConflict
from orchestrator.control.retention import collect_snapshots
from orchestrator.control.staleness import StalenessBound
from orchestrator.control.verifier import Verifier, parse_reward
from orchestrator.domain import (
    EpisodeSpec,
    EpisodeState,
    InvalidArgument,
    NodeRecord,
    NodeState,
    NotFound,
    Preemption,
    PullStatus,
    Reason,
    RewardSpec,
    ids,
)
from orchestrator.state import SqliteStateStore
from orchestrator.trajectory import CanonicalRequest, Ledger
from orchestrator.trajectory.canonical import canonical_message
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb
from snapshots import SnapshotStore
from tests.orchestrator.fakes import FakeAgent, FakeAgents
from tests.snapshots.conftest import forge_manifest, make_meta, replace_manifest

S = EpisodeState
SPEC = EpisodeSpec(image="base", command=("python3", "agent.py"))
SETTINGS = ControlSettings(
    tick_s=0.02, retry_backoff_s=0.05, heartbeat_interval_s=0.05, node_lost_after_s=30, gc_interval_s=3600
)


class Loop:
    """A control loop driven tick by tick, with two fake nodes that report on every tick."""

    def __init__(
        self, root: Path, settings: ControlSettings = SETTINGS, agents: FakeAgents | None = None
    ) -> None:
        self.root = root
        self.store = SqliteStateStore(root / "state.db")
        self.snapshots = SnapshotStore.open(f"file://{root / 'snapshots'}")
        self.agents = agents or FakeAgents(self.snapshots)
        self.ledger = Ledger.sqlite(root / "ledger.db")
        # The real verifier, run by the fake agents: a spec with a reward section gets the
        # reward its verifier prints (`FakeAgents.verifier_logs`).
        finish = Verifier(self.agents, self.ledger)
        self.control = Control(
            settings, self.store, self.snapshots, self.agents, finish=finish, ledger=self.ledger
        )
        self.silent: set[str] = set()

    def register(self, *names: str) -> None:
        for name in names:
            node = NodeRecord(
                name, f"{name}:1", NodeState.READY, "runc", 2, 8192, {"sha256:b": ["base"]}, {}, 0
            )
            self.control.members.registered(node, [])

    def node(self, name: str) -> FakeAgent:
        return self.agents.get(name)

    def report(self) -> None:
        for name, agent in self.agents.agents.items():
            if name not in self.silent:
                self.control.members.heartbeat(name, agent.views(), {"sha256:b": ["base"]})

    def until(self, what: str, predicate: Callable[[], object], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.report()
            self.control.tick()
            time.sleep(0.02)
            if not self.control.work.busy() and predicate():
                return
        raise AssertionError(f"timed out waiting for {what}; episodes: {self.store.episodes.query()}")

    def state(self, episode_id: str) -> EpisodeState:
        return self.store.episodes.get(episode_id).state

    def running(self, spec: EpisodeSpec = SPEC) -> str:
        e = self.store.episodes.submit(spec, "", self.control.pool_of_addresses)
        self.until("RUNNING", lambda: self.state(e.id) == S.RUNNING)
        return e.id

    def close(self) -> None:
        self.control.stop()
        self.snapshots.close()
        self.ledger.close()
        self.store.close()


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(tmp_path)
    loop.register("node-1", "node-2")
    yield loop
    loop.close()


@pytest.mark.timeout(30)
def test_an_episode_starts_with_its_env_and_succeeds_when_the_harness_exits(loop: Loop) -> None:
    episode_id = loop.running()
    e = loop.store.episodes.get(episode_id)
    assert e.runs == 1 and e.sandbox_id == ids.sandbox_id(episode_id, 1)
    agent = loop.node(e.node)
    assert agent.env[e.sandbox_id]["STASIS_EPISODE_ID"] == episode_id
    agent.exit(e.sandbox_id, 0)
    loop.until("SUCCEEDED", lambda: loop.state(episode_id) == S.SUCCEEDED)
    assert ("delete", e.sandbox_id) in agent.calls
    assert loop.store.episodes.get(episode_id).exit_code == 0


@pytest.mark.timeout(30)
def test_preempt_records_the_agents_snapshot_and_resume_restores_it_elsewhere(loop: Loop) -> None:
    episode_id = loop.running()
    first = loop.store.episodes.get(episode_id)
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    held = loop.store.episodes.get(episode_id)
    assert held.held and held.node == "" and held.last_snapshot_id == ids.snapshot_id(episode_id, 1)
    (record,) = loop.store.snapshots.of(episode_id)
    assert record.timings_ms == {"dump_ms": 12.5, "put_ms": 3.0}, "the agent's own figures"
    assert record.reason == "manual" and record.node == first.node and record.stored_bytes > 0

    other = "node-2" if first.node == "node-1" else "node-1"
    loop.control.commands.resume(episode_id, other)
    loop.until("RUNNING again", lambda: loop.state(episode_id) == S.RUNNING)
    e = loop.store.episodes.get(episode_id)
    assert (e.node, e.runs, e.restored_from) == (other, 2, record.id)
    assert e.pinned_node == "", (
        "the pin ends with its placement: were that node lost, any other may resume it"
    )
    assert e.sandbox_id == ids.sandbox_id(episode_id, 2)
    assert loop.node(other).sandboxes[e.sandbox_id].restored_from == record.id


@pytest.mark.timeout(30)
def test_a_snapshot_is_dated_by_the_orchestrators_clock_whatever_the_nodes_says(loop: Loop) -> None:
    """When a snapshot froze its sandbox is compared with when turns were delivered, which the
    orchestrator's clock stamps: a node whose clock is an hour ahead must not move the freeze."""
    episode_id = loop.running()
    loop.node(loop.store.episodes.get(episode_id).node).clock_skew_s = 3600.0
    asked = time.time()
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    (record,) = loop.store.snapshots.of(episode_id)
    assert asked - 1 <= record.created_at <= time.time(), record.created_at - asked


@pytest.mark.timeout(30)
def test_a_lost_checkpoint_reply_is_settled_from_the_snapshot_store(loop: Loop) -> None:
    episode_id = loop.running()
    agent = loop.node(loop.store.episodes.get(episode_id).node)
    agent.commit_then_fail = AgentUnavailable("reply lost", delay=0.1)
    loop.control.commands.preempt(episode_id, "reply will be lost")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    (record,) = loop.store.snapshots.of(episode_id)
    assert record.timings_ms["dump_ms"] == 12.5, "read back from the committed manifest"


@pytest.mark.timeout(30)
def test_a_corrupt_snapshot_falls_back_to_its_parent(loop: Loop) -> None:
    episode_id = loop.running()
    loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, "save", leave_running=True)
    loop.until("an autosave", lambda: loop.store.episodes.get(episode_id).snapshots == 1)
    loop.control.commands.preempt(episode_id, "move")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    parent, latest = (r.id for r in loop.store.snapshots.of(episode_id))
    for agent in loop.agents.agents.values():
        agent.corrupt.add(latest)
    loop.control.commands.resume(episode_id)
    loop.until("RUNNING from the parent", lambda: loop.state(episode_id) == S.RUNNING)
    e = loop.store.episodes.get(episode_id)
    assert e.restored_from == parent and e.last_snapshot_id == parent
    reasons = [ev.reason for ev in loop.store.events.read(0, [episode_id])]
    assert any(f"snapshot {latest} is corrupt" in r and f"falling back to {parent}" in r for r in reasons)


@pytest.mark.timeout(30)
def test_a_refused_spec_fails_at_once_and_an_unreachable_node_is_retried_after_its_delay(loop: Loop) -> None:
    for agent in loop.agents.agents.values():
        agent.fail["create"] = SpecRefused(agent.node, "spec.image: no such image")
    refused = loop.store.episodes.submit(SPEC, "", loop.control.pool_of_addresses)
    loop.until("FAILED", lambda: loop.state(refused.id) == S.FAILED)
    assert "no such image" in loop.store.episodes.get(refused.id).reason
    assert loop.store.episodes.get(refused.id).attempts == 0, "not retried"

    for agent in loop.agents.agents.values():
        agent.fail["create"] = AgentUnavailable("agent restarting", delay=60)
    asked_at = time.time()
    waiting = loop.store.episodes.submit(SPEC, "", loop.control.pool_of_addresses)
    loop.until("a failed attempt", lambda: loop.store.episodes.get(waiting.id).attempts == 1)
    e = loop.store.episodes.get(waiting.id)
    assert e.state == S.PENDING and e.node == ""
    assert e.not_before >= asked_at + 60, "the backoff honours the agent's delay"


@pytest.mark.timeout(30)
def test_fencing_deletes_sandboxes_of_episodes_that_moved_on(loop: Loop) -> None:
    episode_id = loop.running()
    e = loop.store.episodes.get(episode_id)
    other = loop.node("node-2" if e.node == "node-1" else "node-1")
    stale = ids.sandbox_id(episode_id, 7)
    other.create(stale, SPEC, address=e.address, hostname=episode_id, env={})
    other.create("not-an-episode", SPEC, address="", hostname="x", env={})
    loop.until("the stale sandbox deleted", lambda: stale not in other.sandboxes)
    assert "not-an-episode" in other.sandboxes, "only sandboxes the control plane made are fenced"
    assert loop.state(episode_id) == S.RUNNING


@pytest.mark.timeout(30)
def test_a_silent_node_is_lost_and_its_episodes_go_back_to_their_last_snapshot(tmp_path: Path) -> None:
    loop = Loop(tmp_path, replace(SETTINGS, node_lost_after_s=0.5))
    try:
        loop.register("node-1")
        with_snapshot = loop.running(EpisodeSpec(image="base", command=("a",), preemption=Preemption()))
        loop.control.operations.begin_checkpoint(with_snapshot, Reason.AUTOSAVE, "save", leave_running=True)
        loop.until("an autosave", lambda: loop.store.episodes.get(with_snapshot).snapshots == 1)
        fresh = loop.running()
        loop.silent.add("node-1")
        loop.until("node lost", lambda: loop.store.nodes.get("node-1").state == NodeState.LOST)
        assert loop.state(with_snapshot) == S.PREEMPTED
        assert loop.state(fresh) == S.PENDING
        loop.silent.clear()
        loop.until(
            "both running again", lambda: {loop.state(with_snapshot), loop.state(fresh)} == {S.RUNNING}
        )
        assert loop.store.episodes.get(with_snapshot).restored_from == ids.snapshot_id(with_snapshot, 1)
    finally:
        loop.close()


@pytest.mark.timeout(30)
def test_a_checkpoint_intent_left_by_a_crash_is_carried_out_by_the_next_orchestrator(tmp_path: Path) -> None:
    first = Loop(tmp_path)
    first.register("node-1")
    episode_id = first.running()
    node = first.store.episodes.get(episode_id).node
    agents = first.agents
    # The node drains; the intent commits, and the orchestrator dies before the request leaves.
    # (Draining, the node cannot take the episode back, so it stays PREEMPTED for the check.)
    first.store.nodes.set_state(node, NodeState.DRAINING, "drain")
    first.store.episodes.transition(
        episode_id, S.CHECKPOINTING, "drain: node is draining", expect=(S.RUNNING,),
        pending_snapshot_id=ids.snapshot_id(episode_id, 1), pending_reason="drain",
    )  # fmt: skip
    first.control.stop()
    first.store.close()

    second = Loop(tmp_path, agents=agents)
    try:
        second.until("PREEMPTED", lambda: second.state(episode_id) == S.PREEMPTED)
        assert ("checkpoint", ids.sandbox_id(episode_id, 1)) in agents.get(node).calls
        assert [r.reason for r in second.store.snapshots.of(episode_id)] == ["drain"]
    finally:
        second.close()
        first.snapshots.close()


@pytest.mark.timeout(30)
def test_retention_keeps_the_last_snapshots_of_a_live_episode(loop: Loop) -> None:
    episode_id = loop.running()
    for n in range(1, 6):
        loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, f"save {n}", leave_running=True)
        loop.until(f"snapshot {n}", lambda n=n: loop.store.episodes.get(episode_id).snapshots == n)
    report = collect_snapshots(replace(SETTINGS, gc_keep_last=2), loop.store, loop.snapshots)
    assert report is not None
    kept = [r.id for r in loop.store.snapshots.of(episode_id) if loop.snapshots.exists(r.id)]
    assert kept == [ids.snapshot_id(episode_id, 4), ids.snapshot_id(episode_id, 5)]
    assert len(loop.store.snapshots.of(episode_id)) == 5, "records stay as history"
    # Ended: its snapshots stay for the grace period, then go.
    loop.store.episodes.transition(episode_id, S.CANCELLED, "by hand")
    collect_snapshots(replace(SETTINGS, gc_grace_s=600), loop.store, loop.snapshots)
    assert all(loop.snapshots.exists(sid) for sid in kept)
    loop.store.episodes.update(episode_id, finished_at=time.time() - 601)
    collect_snapshots(replace(SETTINGS, gc_grace_s=600), loop.store, loop.snapshots)
    assert not any(loop.snapshots.exists(sid) for sid in kept)


@pytest.mark.timeout(30)
def test_a_tag_is_pinned_once_at_submit_and_a_node_without_the_image_pulls_it(loop: Loop) -> None:
    tag, digest = "127.0.0.1:5000/team/harness:v1", "sha256:" + "d" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    pinned = loop.control.images.pin(tag, "spec.image")
    assert pinned == f"127.0.0.1:5000/team/harness@{digest}"
    episode_id = loop.running(replace(SPEC, image=pinned))
    e = loop.store.episodes.get(episode_id)
    assert loop.node(e.node).specs[e.sandbox_id].image == pinned, "the node is asked for the pinned bytes"
    loop.node("node-1").registry[tag] = "sha256:" + "e" * 64  # the tag moves on: the episode does not
    assert loop.store.episodes.get(episode_id).spec.image == pinned

    with pytest.raises(InvalidArgument) as err:
        loop.control.images.pin("127.0.0.1:5000/team/nothing:v1", "spec.image")
    assert (
        err.value.field == "spec.image"
        and "team/nothing" in str(err.value)
        and "manifest unknown" in str(err.value)
    )
    with pytest.raises(
        InvalidArgument, match=r"spec.image: 'nope' is not cached on any node.*known images: base"
    ):
        loop.control.images.pin("nope", "spec.image")


@pytest.mark.timeout(30)
def test_a_batch_of_submits_asks_a_node_for_each_tag_once(loop: Loop, tmp_path: Path) -> None:
    """A rollout group runs one image: its tag is pinned once for the whole SubmitEpisodes call."""
    tag, digest = "127.0.0.1:5000/team/harness:v1", "sha256:" + "d" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    service = StasisService(loop.control, loop.store, loop.snapshots, Ledger.sqlite(tmp_path / "ledger.db"))
    spec = wire.encode(replace(SPEC, image=tag), pb.EpisodeSpec)
    request = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec) for _ in range(64)])
    reply = service.SubmitEpisodes(request, None)  # type: ignore[arg-type]  # unused on success
    assert {e.spec.image for e in reply.episodes} == {f"127.0.0.1:5000/team/harness@{digest}"}
    asked = [c for n in ("node-1", "node-2") for c in loop.node(n).calls if c[0] == "resolve_image"]
    assert asked == [("resolve_image", tag)]
    service.SubmitEpisodes(request, None)  # type: ignore[arg-type]
    asked = [c for n in ("node-1", "node-2") for c in loop.node(n).calls if c[0] == "resolve_image"]
    assert len(asked) == 2, "the next call asks again: a tag may move between groups"


@pytest.mark.timeout(30)
def test_an_imported_image_is_pulled_on_every_node_and_its_name_pins_it(loop: Loop) -> None:
    tag, digest = "127.0.0.1:5000/stasis/tools:latest", "sha256:" + "f" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    heard: list[PullStatus] = []
    record = loop.control.images.import_image("tools", tag, "docker://tools:latest", heard.append)
    for name in ("node-1", "node-2"):
        assert [(p.phase, p.bytes_done) for p in heard if p.node == name] == [
            ("fetching", 0), ("fetching", 4096), ("done", 0),
        ], "each node's pull is heard as it goes, and its end"  # fmt: skip
    assert (
        record.reference == f"127.0.0.1:5000/stasis/tools@{digest}"
        and record.source == "docker://tools:latest"
    )
    assert all(loop.node(n).pulled == [record.reference] for n in ("node-1", "node-2"))
    assert loop.control.images.caching(record) == ["node-1", "node-2"]
    assert loop.control.images.pin("tools", "spec.image") == record.reference
    with pytest.raises(InvalidArgument, match=r"^name: 'Bad Name' is not an image name"):
        loop.control.images.import_image("Bad Name", tag, "")
    loop.node("node-2").fail["pull_image"] = SpecRefused("node-2", f"image {tag!r}: unauthorized")
    with pytest.raises(InvalidArgument, match=r"unauthorized"):
        loop.control.images.import_image("other", tag, "")
    assert [i.name for i in loop.store.images.all()] == ["tools"], "a failed import catalogues nothing"
    loop.control.images.remove("tools")
    with pytest.raises(NotFound, match=r"image 'tools' was not imported"):
        loop.control.images.remove("tools")


@pytest.mark.timeout(30)
def test_logs_read_each_run_in_order_from_wherever_the_log_is_now(loop: Loop) -> None:
    episode_id = loop.running()
    first = loop.store.episodes.get(episode_id)
    loop.agents.logs[first.sandbox_id] = b"run one\n"
    assert loop.control.logs.page(episode_id).content == b"run one\n", "read from the live sandbox"
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    page = loop.control.logs.page(episode_id)
    assert (page.content, page.complete) == (b"run one\n", False), "read from the snapshot; more will come"
    loop.control.commands.resume(episode_id, "")
    loop.until("RUNNING again", lambda: loop.state(episode_id) == S.RUNNING)
    second = loop.store.episodes.get(episode_id)
    assert second.log_offsets == (0, len(b"run one\n"))
    loop.agents.logs[second.sandbox_id] += b"run two\n"
    loop.node(second.node).exit(second.sandbox_id, 0)
    loop.until("SUCCEEDED", lambda: loop.state(episode_id) == S.SUCCEEDED)
    del loop.agents.logs[second.sandbox_id]  # the sandbox is gone: the kept log answers
    assert loop.control.logs.page(episode_id).content == b"run one\nrun two\n"
    one, two = loop.control.logs.page(episode_id, run=1), loop.control.logs.page(episode_id, run=2)
    assert (one.content, one.complete, two.content, two.complete) == (b"run one\n", True, b"run two\n", True)
    assert loop.control.logs.page(episode_id, run=2, offset=4).content == b"two\n"
    with pytest.raises(InvalidArgument, match=r"^run: episode .* has had 2 run\(s\)"):
        loop.control.logs.page(episode_id, run=3)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("log", "words"),
    [
        (b"ok\nnan\n", "'nan' is not a finite number"),
        (b"inf\n", "'inf' is not a finite number"),
        (b"-Infinity\n\n", "'-Infinity' is not a finite number"),
        (b"1e400\n", "'1e400' is not a finite number"),
        (b"one\n", "'one' is not a number"),
        (b"\n \n", "printed nothing"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_refused(log: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_reward(log)
    assert parse_reward(b"noise\n0.25\n") == 0.25


def _orphan(loop: Loop, episode_id: str, sequence: int, parent: str) -> str:
    """A snapshot the agent published and the record never learned of (an autosave whose reply
    was lost and that was given up before it landed)."""
    e = loop.store.episodes.get(episode_id)
    snapshot = SnapshotTarget(
        snapshot_id=ids.snapshot_id(episode_id, sequence), episode_id=episode_id, sequence=sequence,
        parent_id=parent, reason="autosave", trajectory_cursor=None,
    )  # fmt: skip
    loop.node(e.node).checkpoint(e.sandbox_id, snapshot, leave_running=True)
    return snapshot.snapshot_id


@pytest.mark.timeout(30)
def test_retention_keeps_the_resume_point_however_many_snapshots_came_after_it(loop: Loop) -> None:
    """Issue 45, F4: three snapshots the record does not know, newer than the resume point,
    once pushed it out of the last two kept; now it and the one before it stay."""
    episode_id = loop.running()
    for n in (1, 2):
        loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, f"save {n}", leave_running=True)
        loop.until(f"snapshot {n}", lambda n=n: loop.store.episodes.get(episode_id).snapshots == n)
    resume = loop.store.episodes.get(episode_id).last_snapshot_id
    orphans = [_orphan(loop, episode_id, n, resume) for n in (3, 4, 5)]
    collect_snapshots(replace(SETTINGS, gc_keep_last=2), loop.store, loop.snapshots)
    kept = {sid for sid in [ids.snapshot_id(episode_id, 1), resume, *orphans] if loop.snapshots.exists(sid)}
    assert kept == {ids.snapshot_id(episode_id, 1), resume, *orphans[-2:]}


@pytest.mark.timeout(30)
def test_an_autosave_still_under_way_when_its_orchestrator_died_is_recorded_when_it_lands(
    tmp_path: Path,
) -> None:
    """Issue 45, F4: settling no longer gives up an autosave the agent is still taking (then its
    snapshot landed unrecorded, newer than the resume point); it records it once it lands."""
    first = Loop(tmp_path)
    first.register("node-1")
    episode_id = first.running()
    e = first.store.episodes.get(episode_id)
    agents = first.agents
    pending = ids.snapshot_id(episode_id, 1)
    first.store.episodes.update(episode_id, pending_snapshot_id=pending, pending_reason="autosave")
    view = agents.get(e.node).sandboxes[e.sandbox_id]
    agents.get(e.node).sandboxes[e.sandbox_id] = replace(view, busy=True)  # the agent is still at it
    first.control.stop()
    first.store.close()

    second = Loop(tmp_path, agents=agents)
    try:
        for _ in range(20):
            second.report()
            second.control.tick()
            time.sleep(0.02)
        assert second.store.episodes.get(episode_id).pending_snapshot_id == pending, "not given up while busy"
        snapshot = SnapshotTarget(pending, episode_id, 1, "", "autosave", None)
        agents.get(e.node).checkpoint(e.sandbox_id, snapshot, leave_running=True)
        agents.get(e.node).sandboxes[e.sandbox_id] = view
        second.until("recorded", lambda: second.store.episodes.get(episode_id).last_snapshot_id == pending)
        assert second.store.episodes.get(episode_id).pending_snapshot_id == ""
    finally:
        second.close()
        first.snapshots.close()


@pytest.mark.timeout(30)
def test_a_resume_point_gone_from_the_store_falls_back_to_the_newest_snapshot_before_it(loop: Loop) -> None:
    """Issue 45, F4: a restore that finds its snapshot gone resumes from the one before it that
    the store still holds, never FAILED while one exists."""
    episode_id = loop.running()
    for n in (1, 2, 3):
        loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, f"save {n}", leave_running=True)
        loop.until(f"snapshot {n}", lambda n=n: loop.store.episodes.get(episode_id).snapshots == n)
    loop.control.commands.preempt(episode_id, "move")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    _first, second, third, latest = (r.id for r in loop.store.snapshots.of(episode_id))
    loop.snapshots.delete(latest)
    loop.snapshots.delete(third)
    loop.control.commands.resume(episode_id)
    loop.until("RUNNING from an older snapshot", lambda: loop.state(episode_id) == S.RUNNING)
    assert loop.store.episodes.get(episode_id).restored_from == second
    reasons = [ev.reason for ev in loop.store.events.read(0, [episode_id])]
    assert any(f"snapshot {latest} is gone" in r and f"falling back to {second}" in r for r in reasons)


def _saved(loop: Loop, episode_id: str, n: int) -> None:
    loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, f"save {n}", leave_running=True)
    loop.until(f"snapshot {n}", lambda: loop.store.episodes.get(episode_id).snapshots == n)


@pytest.mark.timeout(30)
def test_a_resume_manifest_replaced_in_the_store_is_refused_and_the_episode_falls_back(
    loop: Loop, tmp_path: Path
) -> None:
    """Issue 45, F8: a writer with the store's credentials replaces a PREEMPTED episode's resume
    manifest. The restore carries the digest recorded from the node's reply, the node refuses
    the manifest naming the snapshot, and the episode falls back past a snapshot recorded without
    a digest to the newest one that has one; the node is never asked for the undigested one."""
    episode_id = loop.running()
    _saved(loop, episode_id, 1)
    node = loop.node(loop.store.episodes.get(episode_id).node)
    node.reports_digest = False  # an agent from before manifests were digested
    _saved(loop, episode_id, 2)
    node.reports_digest = True
    loop.control.commands.preempt(episode_id, "move")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    first, undigested, latest = loop.store.snapshots.of(episode_id)
    assert first.manifest_digest == loop.snapshots.manifest(first.id).digest
    assert latest.manifest_digest == loop.snapshots.manifest(latest.id).digest
    assert undigested.manifest_digest == ""

    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "pages.img").write_bytes(b"a process that keeps root and drops its seccomp filter")
    replace_manifest(loop.snapshots, latest.id, forge_manifest(loop.snapshots, evil, latest.id))
    loop.control.commands.resume(episode_id)
    loop.until("RUNNING from the older snapshot", lambda: loop.state(episode_id) == S.RUNNING)

    assert loop.store.episodes.get(episode_id).restored_from == first.id
    asked = [pair for agent in loop.agents.agents.values() for pair in agent.restored]
    assert asked == [(latest.id, latest.manifest_digest), (first.id, first.manifest_digest)]
    reasons = [ev.reason for ev in loop.store.events.read(0, [episode_id])]
    assert any(
        f"snapshot {latest.id} is corrupt" in r and "replaced" in r and f"falling back to {first.id}" in r
        for r in reasons
    ), reasons


@pytest.mark.timeout(30)
def test_a_snapshot_recorded_without_a_manifest_digest_is_never_restored(loop: Loop) -> None:
    """Issue 45, F8: a record from before manifests were digested (or of an agent that gave
    none) vouches for nothing the store holds: the episode fails naming the snapshot rather than
    restore it, and no node is asked to."""
    episode_id = loop.running()
    loop.node(loop.store.episodes.get(episode_id).node).reports_digest = False
    loop.control.commands.preempt(episode_id, "move")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    (record,) = loop.store.snapshots.of(episode_id)
    loop.control.commands.resume(episode_id)
    loop.until("FAILED", lambda: loop.state(episode_id) == S.FAILED)
    assert [pair for agent in loop.agents.agents.values() for pair in agent.restored] == []
    reason = loop.store.episodes.get(episode_id).reason
    assert f"snapshot {record.id} has no recorded manifest digest" in reason, reason


@pytest.mark.timeout(30)
def test_a_lost_reply_records_the_snapshot_only_if_the_store_holds_the_one_asked_of_the_node(
    loop: Loop, tmp_path: Path
) -> None:
    """Issue 45, F8: with the node's reply (and its digest) lost, the snapshot is recorded from the
    store, with the digest of the manifest read, only if it is the snapshot asked of that node;
    never when the node said the id was taken (it wrote nothing: another did)."""
    episode_id = loop.running()
    e = loop.store.episodes.get(episode_id)
    node = loop.node(e.node)
    node.commit_then_fail = AgentUnavailable("reply lost", delay=0.01)
    _saved(loop, episode_id, 1)
    (record,) = loop.store.snapshots.of(episode_id)
    assert record.manifest_digest == loop.snapshots.manifest(record.id).digest

    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "pages.img").write_bytes(b"planted")
    for sequence, planted_by, said in (
        (2, e.node, SandboxConflict(e.node, "snapshot already exists")),
        (3, "node-a", AgentUnavailable("reply lost", delay=0.01)),
    ):
        planted = ids.snapshot_id(episode_id, sequence)
        meta = replace(make_meta(planted, episode_id, sequence, record.id), node=planted_by)
        loop.snapshots.put(evil, meta)  # by a writer with the store's credentials
        node.fail["checkpoint"] = said
        pending = loop.store.episodes.update(
            episode_id, pending_snapshot_id=planted, pending_reason="autosave"
        )
        loop.control.operations.checkpoint(pending, True)
        assert [r.id for r in loop.store.snapshots.of(episode_id)] == [record.id], f"{planted} recorded"


class _Aborted(Exception):
    """What the stand-in for gRPC's servicer context raises where the real one ends the call."""


class _Context:
    def abort(self, code: object, details: str) -> None:
        raise _Aborted(code, details)


@pytest.mark.timeout(30)
def test_an_export_is_of_the_manifest_recorded_or_none(loop: Loop, tmp_path: Path) -> None:
    """Issue 45, F8: an exported archive is restored elsewhere as it is, so ExportSnapshot reads
    the snapshot through the digest recorded of it: a manifest replaced in the store, or a
    snapshot recorded without a digest, is not exported."""
    episode_id = loop.running()
    _saved(loop, episode_id, 1)
    loop.node(loop.store.episodes.get(episode_id).node).reports_digest = False
    _saved(loop, episode_id, 2)
    recorded, undigested = loop.store.snapshots.of(episode_id)
    service = StasisService(loop.control, loop.store, loop.snapshots, Ledger.sqlite(tmp_path / "ledger.db"))

    def export(snapshot_id: str) -> bytes:
        request = pb.ExportSnapshotRequest(snapshot_id=snapshot_id)
        return b"".join(c.data for c in service.ExportSnapshot(request, _Context()))  # type: ignore[arg-type]

    # Read through (to a refusal of its own: a fake node's snapshot holds no checkpoint.json).
    with pytest.raises(_Aborted, match=r"checkpoint\.json: missing"):
        export(recorded.id)
    with pytest.raises(_Aborted, match=f"{undigested.id}.*no recorded manifest digest"):
        export(undigested.id)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "pages.img").write_bytes(b"planted")
    replace_manifest(loop.snapshots, recorded.id, forge_manifest(loop.snapshots, evil, recorded.id))
    with pytest.raises(_Aborted, match=f"{recorded.id}.*replaced"):
        export(recorded.id)


# GRPO groups ----------------------------------------------------------------------------------

GRADED = replace(SPEC, reward=RewardSpec(command=("python3", "/grade.py")))


class _Streaming:
    """The servicer context a stream in progress sees: the caller is still there."""

    def is_active(self) -> bool:
        return True


def _submit_group(service: StasisService, group: pb.EpisodeGroup, n: int | None = None) -> list[str]:
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    submits = [
        pb.SubmitEpisodeRequest(spec=spec, request_id=f"{group.id}/{i}") for i in range(n or group.size)
    ]
    reply = service.SubmitEpisodes(pb.SubmitEpisodesRequest(submits=submits, group=group), None)  # type: ignore[arg-type]
    return [e.id for e in reply.episodes]


def _group_item(service: StasisService) -> tuple[pb.GroupResult, list[str]]:
    """A stream's first group item, and the episodes whose trajectories came before it."""
    request = pb.StreamTrajectoriesRequest(include_groups=True)
    stream = service.StreamTrajectories(request, _Streaming())  # type: ignore[arg-type]
    try:
        before = []
        for item in stream:
            if item.HasField("group"):
                assert item.episode_id == "", "a group item carries no episode"
                return item.group, before
            before.append(item.episode_id)
    finally:
        stream.close()
    raise AssertionError("no group item")


def _finish_running(loop: Loop, members: list[str]) -> None:
    """Every member that runs now exits 0 (its harness is done); the verifier gives its reward."""
    for episode_id in members:
        e = loop.store.episodes.get(episode_id)
        if e.state == S.RUNNING and e.sandbox_id in loop.node(e.node).sandboxes:
            loop.node(e.node).exit(e.sandbox_id, 0)


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[tuple[Loop, StasisService]]:
    loop = Loop(tmp_path)
    loop.register("node-1", "node-2", "node-3", "node-4", "node-5")
    yield loop, StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
    loop.close()


@pytest.mark.timeout(60)
def test_a_group_item_comes_once_all_8_members_are_final_with_their_8_rewards(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-1", task_id="task-7", size=8))
    for index, episode_id in enumerate(members):
        e = loop.store.episodes.get(episode_id)
        assert (e.group_id, e.group_index) == ("g-1", index)
        loop.agents.verifier_logs[episode_id] = f"grading...\n{index / 8}\n".encode()
    shown = service.GetEpisode(pb.GetEpisodeRequest(episode_id=members[3]), None)  # type: ignore[arg-type]
    assert (shown.group_id, shown.group_index) == ("g-1", 3)
    loop.until("all 8 running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    _finish_running(loop, members[:7])
    loop.until("7 final", lambda: sum(loop.state(m).terminal for m in members) == 7)
    (listed,) = service.ListGroups(pb.ListGroupsRequest(), None).groups  # type: ignore[arg-type]
    assert (listed.final, listed.complete, listed.broken) == (7, False, False)

    _finish_running(loop, members[7:])
    loop.until("all final", lambda: all(loop.state(m).terminal for m in members))
    group, before = _group_item(service)
    assert (group.id, group.task_id, group.size, group.final) == ("g-1", "task-7", 8, 8)
    assert group.complete and not group.broken and group.problem == ""
    assert [(m.index, m.episode_id) for m in group.members] == list(enumerate(members))
    assert [m.reward for m in group.members] == [i / 8 for i in range(8)]
    assert all(m.has_reward and m.state == pb.EPISODE_STATE_SUCCEEDED for m in group.members)
    assert sorted(before) == sorted(members), "after the trajectories of all 8, once"
    assert before[-1] == max(members, key=lambda m: loop.store.episodes.get(m).finished_at)


@pytest.mark.timeout(60)
def test_a_member_whose_node_is_lost_mid_run_runs_again_and_the_group_completes_with_real_rewards(
    tmp_path: Path,
) -> None:
    """The member goes back to its autosave and is restored elsewhere; its reward is its
    verifier's, from the run that finished, and nothing is made up for the run that was lost."""
    loop = Loop(tmp_path, replace(SETTINGS, node_lost_after_s=0.5))
    try:
        loop.register("node-1", "node-2", "node-3", "node-4", "node-5")
        service = StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
        members = _submit_group(service, pb.EpisodeGroup(id="g-2", task_id="task-7", size=8))
        for index, episode_id in enumerate(members):
            loop.agents.verifier_logs[episode_id] = f"{index + 1}\n".encode()
        loop.until("all 8 running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
        hit = members[3]
        loop.control.operations.begin_checkpoint(hit, Reason.AUTOSAVE, "save", leave_running=True)
        loop.until("an autosave", lambda: loop.store.episodes.get(hit).snapshots == 1)
        lost = loop.store.episodes.get(hit).node
        on_lost = [m for m in members if loop.store.episodes.get(m).node == lost]
        loop.silent.add(lost)
        loop.until("the node lost", lambda: loop.store.nodes.get(lost).state == NodeState.LOST)
        assert loop.state(hit) in (S.PREEMPTED, S.RESTORING, S.RUNNING)
        _finish_running(loop, [m for m in members if m not in on_lost])
        loop.until("the lost node's members running elsewhere", lambda: all(
            loop.store.episodes.get(m).node not in ("", lost) and loop.state(m) == S.RUNNING for m in on_lost
        ))  # fmt: skip
        assert loop.store.episodes.get(hit).restored_from == ids.snapshot_id(hit, 1)
        assert loop.store.episodes.get(hit).runs == 2
        _finish_running(loop, on_lost)
        loop.until("all final", lambda: all(loop.state(m).terminal for m in members))

        group, _ = _group_item(service)
        assert group.complete and group.final == 8
        assert [m.reward for m in group.members] == [float(i + 1) for i in range(8)]
        assert {m.state for m in group.members} == {pb.EPISODE_STATE_SUCCEEDED}
    finally:
        loop.close()


@pytest.mark.timeout(60)
def test_a_group_with_a_cancelled_member_says_it_cannot_complete_and_which_member(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-3", task_id="task-1", size=3))
    loop.until("all running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    loop.control.commands.cancel(members[1])
    loop.until("cancelled", lambda: loop.state(members[1]) == S.CANCELLED)
    group, before = _group_item(service)
    assert group.broken and not group.complete and group.final == 1
    assert (group.broken_by.index, group.broken_by.episode_id) == (1, members[1])
    assert group.broken_by.state == pb.EPISODE_STATE_CANCELLED and not group.broken_by.has_reward
    assert f"member 1 ({members[1]}) cancelled without a reward" in group.problem, group.problem
    assert before == [members[1]]


@pytest.mark.timeout(60)
def test_a_member_whose_snapshot_cannot_be_restored_starts_over_rather_than_fail(
    groups: tuple[Loop, StasisService],
) -> None:
    """Where an episode alone would fail (its only snapshot vouched for by no digest), a group's
    member runs again from the beginning."""
    loop, service = groups
    (member,) = _submit_group(service, pb.EpisodeGroup(id="g-4", task_id="task-1", size=1))
    loop.until("running", lambda: loop.state(member) == S.RUNNING)
    loop.node(loop.store.episodes.get(member).node).reports_digest = False
    loop.control.commands.preempt(member, "move")
    loop.until("PREEMPTED", lambda: loop.state(member) == S.PREEMPTED)
    loop.control.commands.resume(member)
    # Run 2 was the restore that could not be made; run 3 starts from the spec.
    loop.until(
        "running again", lambda: loop.state(member) == S.RUNNING and loop.store.episodes.get(member).runs == 3
    )
    e = loop.store.episodes.get(member)
    assert (e.restored_from, e.last_snapshot_id, e.log_offsets[:2]) == ("", "", (-1, -1))
    reasons = [ev.reason for ev in loop.store.events.read(0, [member])]
    assert any("has no recorded manifest digest" in r and "member 0 starts over" in r for r in reasons)


def _sampled(loop: Loop, episode_id: str, version: str, text: str = "go") -> None:
    """A turn the gateway sampled for the episode's current run under `version`."""
    e = loop.store.episodes.get(episode_id)
    request = CanonicalRequest.parse("chat", {"model": "m", "messages": [{"role": "user", "content": text}]})
    answer = canonical_message({"role": "assistant", "content": "ok"})
    loop.ledger.record(episode_id, e.runs, 0.0, request, b"{}", answer, b"", "chat", b"", [5, 6], [-0.5, -0.5],
                       [1, 2], version, 1.0)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_member_whose_next_turn_would_exceed_max_staleness_runs_again_from_the_start(
    groups: tuple[Loop, StasisService],
) -> None:
    """Group g-5 (max_staleness 1): member 0's oldest tokens fall 2 versions behind and it runs
    again from the spec, not its snapshot; member 1, 1 behind, and an unbounded group's member,
    2 behind, run on. The group completes with every member's own verifier's reward."""
    loop, service = groups
    bounded = _submit_group(service, pb.EpisodeGroup(id="g-5", task_id="task-1", size=2, max_staleness=1))
    (free,) = _submit_group(service, pb.EpisodeGroup(id="g-6", task_id="task-1", size=1))
    for index, episode_id in enumerate([*bounded, free]):
        loop.agents.verifier_logs[episode_id] = f"{index + 1}\n".encode()
    everyone = [*bounded, free]
    loop.until("all running", lambda: {loop.state(m) for m in everyone} == {S.RUNNING})
    stale, fresh = bounded
    loop.ledger.policy.publish(3)
    _sampled(loop, stale, "3")
    _sampled(loop, free, "3")
    loop.ledger.policy.publish(4)
    _sampled(loop, fresh, "4")
    _sampled(loop, stale, "4", "more")
    loop.control.operations.begin_checkpoint(stale, Reason.AUTOSAVE, "save", leave_running=True)
    loop.until("an autosave", lambda: loop.store.episodes.get(stale).snapshots == 1)
    loop.until("some ticks within the bound", lambda: True)
    assert {loop.store.episodes.get(m).runs for m in everyone} == {1}, "1 version behind: within the bound"

    first = loop.store.episodes.get(stale)
    loop.ledger.policy.publish(5)
    loop.until(
        "member 0 running again",
        lambda: loop.store.episodes.get(stale).runs == 2 and loop.state(stale) == S.RUNNING,
    )
    again = loop.store.episodes.get(stale)
    assert (again.restored_from, again.last_snapshot_id, again.log_offsets[:1]) == ("", "", (-1,))
    assert ("delete", first.sandbox_id) in loop.node(first.node).calls
    reasons = [ev.reason for ev in loop.store.events.read(0, [stale])]
    assert any(
        "stale-bounded: its oldest live tokens are 2 policy versions behind the published version 5, past its "
        "group's max_staleness 1; group g-5's member 0 runs again from the start" in r
        for r in reasons
    ), reasons
    assert [t.abandoned for t in loop.ledger.turns(stale)] == [True, True], "never replayed to the new run"
    assert loop.store.episodes.get(fresh).runs == loop.store.episodes.get(free).runs == 1
    assert [t.abandoned for t in loop.ledger.turns(fresh) + loop.ledger.turns(free)] == [False, False]

    _sampled(loop, stale, "5")  # the new run's first turn, under the published version
    loop.until("some ticks", lambda: True)
    assert loop.store.episodes.get(stale).runs == 2, "the new run is within the bound"
    _finish_running(loop, everyone)
    loop.until("all final", lambda: all(loop.state(m).terminal for m in everyone))
    listed = {g.id: g for g in service.ListGroups(pb.ListGroupsRequest(), None).groups}  # type: ignore[arg-type]
    assert listed["g-5"].complete and [m.reward for m in listed["g-5"].members] == [1.0, 2.0]
    assert listed["g-6"].complete and [m.reward for m in listed["g-6"].members] == [3.0]


@pytest.mark.timeout(60)
def test_a_tick_reads_the_published_version_and_a_groups_bound_once_for_all_its_members(
    groups: tuple[Loop, StasisService],
) -> None:
    """Three bounded members within their bound: telling each costs its own live versions, but
    the published version and the group's bound are read once per tick, not once per member."""
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-9", task_id="task-1", size=3, max_staleness=1))
    loop.until("all running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    loop.ledger.policy.publish(3)
    for m in members:
        _sampled(loop, m, "3")
    reads: list[str] = []

    class Counted:  # the loop's own store and ledger, each read counted; its ticks run on apart
        def __init__(self, inner: object, name: str) -> None:
            self.inner, self.name = inner, name

        def __getattr__(self, attr: str) -> object:
            if attr in ("groups", "published"):
                reads.append(attr)
            value = getattr(self.inner, attr)
            return Counted(value, attr) if attr == "policy" else value

    bound = StalenessBound(Counted(loop.store, "store"), Counted(loop.ledger, "ledger"), loop.control.members)  # type: ignore[arg-type]
    bound.new_tick()
    assert [bound.why(loop.store.episodes.get(m)) for m in members] == ["", "", ""]
    assert reads == ["groups", "published"]
    bound.new_tick()
    assert bound.why(loop.store.episodes.get(members[0])) == ""
    assert reads == ["groups", "published"] * 2, "a new tick reads them afresh"


@pytest.mark.timeout(60)
def test_a_member_whose_run_an_upstream_outage_cut_short_runs_again_and_is_graded_on_a_whole_run(
    tmp_path: Path,
) -> None:
    """Member 0's harness exits 1 when the last thing its run had was the model server failing:
    it is not graded on that run but runs again (from the start: it has no snapshot). Member 1's
    model server failed too, but a turn followed, so its exit is its own and it is graded. Past
    `group_max_attempts` such runs a member fails naming the outage, with no reward."""
    loop = Loop(tmp_path, replace(SETTINGS, group_max_attempts=3))
    loop.register("node-1", "node-2")
    service = StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
    try:
        cut, own = _submit_group(service, pb.EpisodeGroup(id="g-up", task_id="task-1", size=2))
        loop.agents.verifier_logs[cut] = loop.agents.verifier_logs[own] = b"0.5\n"
        loop.until("both running", lambda: {loop.state(m) for m in (cut, own)} == {S.RUNNING})
        loop.ledger.outages.failed(cut, 1, "model server: 502 connection refused")
        loop.ledger.outages.failed(own, 1, "model server: 502 connection refused")
        time.sleep(0.01)
        _sampled(loop, own, "1")
        first = loop.store.episodes.get(cut)
        for m in (cut, own):
            e = loop.store.episodes.get(m)
            loop.node(e.node).exit(e.sandbox_id, 1)
        loop.until("member 1 graded", lambda: loop.state(own) == S.SUCCEEDED)
        assert loop.store.episodes.get(own).reward == 0.5
        loop.until(
            "member 0 running again",
            lambda: loop.store.episodes.get(cut).runs == 2 and loop.state(cut) == S.RUNNING,
        )
        assert loop.store.episodes.get(cut).reward is None and loop.ledger.verifications.get(cut) is None, (
            "never graded"
        )
        assert ("delete", first.sandbox_id) in loop.node(first.node).calls
        reasons = [ev.reason for ev in loop.store.events.read(0, [cut])]
        assert any(
            "harness exited with code 1 after the model server failed its run: model server: 502 connection "
            "refused; no snapshot yet, starting over" in r
            for r in reasons
        ), reasons

        for run in (2, 3):  # the outage goes on: the third run so ended is past group_max_attempts
            loop.until(
                f"run {run}",
                lambda run=run: loop.store.episodes.get(cut).runs == run and loop.state(cut) == S.RUNNING,
            )
            loop.ledger.outages.failed(cut, run, "model server: 503 overloaded")
            e = loop.store.episodes.get(cut)
            loop.node(e.node).exit(e.sandbox_id, 1)
        loop.until("member 0 failed", lambda: loop.state(cut) == S.FAILED)
        final = loop.store.episodes.get(cut)
        assert final.reward is None and final.reason == (
            "harness exited with code 1 after the model server failed its run: model server: 503 overloaded; "
            "3 runs ended so, past group_max_attempts"
        )
        (group,) = service.ListGroups(pb.ListGroupsRequest(), None).groups  # type: ignore[arg-type]
        assert group.broken and "model server: 503 overloaded" in group.problem
    finally:
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("group", "submits", "field"),
    [
        (pb.EpisodeGroup(id="g", task_id="t", size=0), 1, "group.size"),
        (pb.EpisodeGroup(id="g", task_id="t", size=1001), 1001, "group.size"),
        (pb.EpisodeGroup(id="g", task_id="t", size=3), 2, "group.size"),
        (pb.EpisodeGroup(id="", task_id="t", size=1), 1, "group.id"),
        (pb.EpisodeGroup(id="g g", task_id="t", size=1), 1, "group.id"),
        (pb.EpisodeGroup(id="g", task_id="", size=1), 1, "group.task_id"),
        (pb.EpisodeGroup(id="g", task_id="t", size=1, max_staleness=-1), 1, "group.max_staleness"),
        (pb.EpisodeGroup(id="taken", task_id="t", size=3), 3, "group.size"),
        (pb.EpisodeGroup(id="taken", task_id="other", size=2), 2, "group.task_id"),
    ],
)
def test_bad_group_input_is_refused_naming_the_field_and_nothing_is_stored(
    groups: tuple[Loop, StasisService], group: pb.EpisodeGroup, submits: int, field: str
) -> None:
    loop, service = groups
    _submit_group(service, pb.EpisodeGroup(id="taken", task_id="t", size=2))
    stored, events = loop.store.episodes.query(), loop.store.events.read()
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    request = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec)] * submits, group=group)
    with pytest.raises(_Aborted) as err:
        service.SubmitEpisodes(request, _Context())  # type: ignore[arg-type]
    code, details = err.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}: "), details
    assert loop.store.episodes.query() == stored and loop.store.events.read() == events
    assert [g.id for g in loop.store.groups.all()] == ["taken"]


@pytest.mark.timeout(30)
def test_a_group_submitted_again_returns_its_members_and_new_members_are_refused(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    group = pb.EpisodeGroup(id="g-5", task_id="t", size=2)
    first = _submit_group(service, group)
    assert _submit_group(service, group) == first, "a retry with the same request ids"
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    fresh = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec)] * 2, group=group)
    with pytest.raises(_Aborted, match=r"group.id: group 'g-5' has its member 0 already"):
        service.SubmitEpisodes(fresh, _Context())  # type: ignore[arg-type]
    assert [e.id for e in loop.store.groups.members("g-5")] == first
