"""Membership (`control/membership.py`): fencing stale sandboxes, and a silent
node declared lost.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.domain import EpisodeSpec, NodeState, Preemption, Reason, ids
from tests.orchestrator.loops import SETTINGS, SPEC, Loop, S


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
