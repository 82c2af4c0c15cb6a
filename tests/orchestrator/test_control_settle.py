"""Settling (`control/settle.py`): a lost reply, or an intent an orchestrator left
when it died, settled from the truth on the node and in the snapshot store.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.control import AgentUnavailable, SnapshotTarget
from orchestrator.control.node_agent import SandboxConflict
from orchestrator.domain import NodeState, ids
from tests.orchestrator.loops import Loop, S, saved
from tests.snapshots.conftest import make_meta


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
    saved(loop, episode_id, 1)
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
