"""Retention (`control/retention.py`): which snapshots are kept.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from orchestrator.control import SnapshotTarget
from orchestrator.control.retention import collect_snapshots
from orchestrator.domain import Reason, ids
from tests.orchestrator.loops import SETTINGS, Loop, S


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
