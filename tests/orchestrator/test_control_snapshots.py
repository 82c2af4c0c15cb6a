"""Which snapshot a restore or an export reads: only one whose recorded manifest
digest the store still matches; a restore otherwise falls back to the newest before it.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api.service import StasisService
from orchestrator.domain import Reason
from orchestrator.trajectory import Ledger
from protos.stasis.v1 import stasis_pb2 as pb
from tests.orchestrator.loops import Aborted, Context, Loop, S, saved
from tests.snapshots.conftest import forge_manifest, replace_manifest


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


@pytest.mark.timeout(30)
def test_a_resume_manifest_replaced_in_the_store_is_refused_and_the_episode_falls_back(
    loop: Loop, tmp_path: Path
) -> None:
    """Issue 45, F8: a writer with the store's credentials replaces a PREEMPTED episode's resume
    manifest. The restore carries the digest recorded from the node's reply, the node refuses
    the manifest naming the snapshot, and the episode falls back past a snapshot recorded without
    a digest to the newest one that has one; the node is never asked for the undigested one."""
    episode_id = loop.running()
    saved(loop, episode_id, 1)
    node = loop.node(loop.store.episodes.get(episode_id).node)
    node.reports_digest = False  # an agent from before manifests were digested
    saved(loop, episode_id, 2)
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
def test_an_export_is_of_the_manifest_recorded_or_none(loop: Loop, tmp_path: Path) -> None:
    """Issue 45, F8: an exported archive is restored elsewhere as it is, so ExportSnapshot reads
    the snapshot through the digest recorded of it: a manifest replaced in the store, or a
    snapshot recorded without a digest, is not exported."""
    episode_id = loop.running()
    saved(loop, episode_id, 1)
    loop.node(loop.store.episodes.get(episode_id).node).reports_digest = False
    saved(loop, episode_id, 2)
    recorded, undigested = loop.store.snapshots.of(episode_id)
    service = StasisService(loop.control, loop.store, loop.snapshots, Ledger.sqlite(tmp_path / "ledger.db"))

    def export(snapshot_id: str) -> bytes:
        request = pb.ExportSnapshotRequest(snapshot_id=snapshot_id)
        return b"".join(c.data for c in service.ExportSnapshot(request, Context()))  # type: ignore[arg-type]

    # Read through (to a refusal of its own: a fake node's snapshot holds no checkpoint.json).
    with pytest.raises(Aborted, match=r"checkpoint\.json: missing"):
        export(recorded.id)
    with pytest.raises(Aborted, match=f"{undigested.id}.*no recorded manifest digest"):
        export(undigested.id)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "pages.img").write_bytes(b"planted")
    replace_manifest(loop.snapshots, recorded.id, forge_manifest(loop.snapshots, evil, recorded.id))
    with pytest.raises(Aborted, match=f"{recorded.id}.*replaced"):
        export(recorded.id)
