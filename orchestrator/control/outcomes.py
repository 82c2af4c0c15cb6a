"""How the result of an operation on a node is committed: the transitions that operations and
settling share, each with its reason, and the clean-up when the episode moved on meanwhile."""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.control.membership import Membership
from orchestrator.control.node_agent import CheckpointOutcome, SnapshotTarget
from orchestrator.control.settings import ControlSettings
from orchestrator.domain import (
    Episode,
    EpisodeState,
    FailedPrecondition,
    Reason,
    SnapshotRecord,
    TemporaryError,
    ids,
)
from orchestrator.state import StateStore
from snapshots import SnapshotError, SnapshotStore

log = logging.getLogger(__name__)
S = EpisodeState


class Outcomes:
    def __init__(
        self, settings: ControlSettings, store: StateStore, snapshots: SnapshotStore, members: Membership
    ) -> None:
        self.settings = settings
        self.store = store
        self.snapshots = snapshots
        self.members = members

    def retry_at(self, e: Episode, exc: Exception | None = None) -> float:
        """When to try a failed start or restore again: exponential backoff, and never sooner
        than an unreachable agent asked."""
        wait = self.settings.retry_backoff_s * 2 ** min(e.attempts, 6)
        if isinstance(exc, TemporaryError):
            wait = max(wait, exc.delay)
        return time.time() + wait

    def gives_up(self, e: Episode, *, member_limit: bool = True) -> bool:
        """Whether this failed start or restore attempt of `e` is its last (see `settings`): a
        GRPO group's member is given `group_max_attempts` where others have `max_attempts`."""
        limit = self.settings.max_attempts
        if e.group_id and member_limit:
            limit = self.settings.group_max_attempts
        return e.attempts + 1 >= limit

    def start_over(self, e: Episode, why: str) -> None:
        """A group member whose snapshots cannot be restored runs again from the start rather
        than fail: its group would be lost with it. The old lineage is left to retention."""
        to, reset = e.from_the_start()
        self.transition_or_cleanup(
            e, to, f"{why}; group {e.group_id}'s member {e.group_index} starts over",
            expect=(S.RESTORING,), node="", sandbox_id="", attempts=0, not_before=0.0, queued_at=time.time(),
            pinned_node="", **reset,
        )  # fmt: skip

    def transition_or_cleanup(
        self, e: Episode, to: EpisodeState, reason: str, expect: tuple[EpisodeState, ...] = (), **changes: Any
    ) -> None:
        """Commit the outcome; if the episode moved on meanwhile (cancelled), remove its sandbox."""
        try:
            self.store.episodes.transition(e.id, to, reason, expect=expect, **changes)
        except FailedPrecondition as exc:
            log.info("episode %s moved on during an operation (%s); removing its sandbox", e.id, exc)
            if e.node and e.sandbox_id:
                self.members.delete_quietly(e.node, e.sandbox_id)

    def running(self, e: Episode, expect: EpisodeState, reason: str, **changes: Any) -> None:
        # A resume's pin has done its work once the run is there; kept, it would hold the
        # episode to that node after a later loss of it.
        self.transition_or_cleanup(
            e, S.RUNNING, reason, expect=(expect,), run_started_at=time.time(), attempts=0, not_before=0.0,
            pinned_node="", **changes,
        )  # fmt: skip

    def start_failed(self, e: Episode, problem: str, *, final: bool, exc: Exception | None = None) -> None:
        if final:
            self.transition_or_cleanup(e, S.FAILED, f"could not start: {problem}", node="", sandbox_id="")
        else:
            self.store.episodes.update(
                e.id, node="", sandbox_id="", attempts=e.attempts + 1, not_before=self.retry_at(e, exc),
                decision=f"start on {e.node} failed, will retry: {problem}",
            )  # fmt: skip

    def restore_failed(self, e: Episode, reason: str, *, final: bool, exc: Exception | None = None) -> None:
        """A restore that failed: retried later, or, if `final`, the end of the episode; a group
        member starts over from the beginning instead (`start_over`), as no fault of its spec
        keeps a restore from working."""
        if final and e.group_id and not e.restores_its_fork:
            self.start_over(e, reason)  # a fork child's start is that snapshot: no way round it
        elif final:
            self.transition_or_cleanup(e, S.FAILED, reason, node="", sandbox_id="")
        else:
            self.transition_or_cleanup(
                e, S.PREEMPTED, reason, expect=(S.RESTORING,), node="", sandbox_id="",
                attempts=e.attempts + 1, not_before=self.retry_at(e, exc),
            )  # fmt: skip

    def recover(self, e: Episode, why: str) -> None:
        """Send an episode back to its last snapshot, or to the start if it has none."""
        try:
            if e.last_snapshot_id:
                self.store.episodes.transition(
                    e.id, S.PREEMPTED, f"{why}; resuming from snapshot {e.last_snapshot_id}", node="",
                    sandbox_id="", pending_snapshot_id="", pending_reason="", queued_at=time.time(), held=False,
                    pinned_node="",
                )  # fmt: skip
            else:
                self.store.episodes.transition(
                    e.id, S.PENDING, f"{why}; no snapshot yet, starting over", node="", sandbox_id="",
                    pending_snapshot_id="", pending_reason="", queued_at=time.time(),
                )  # fmt: skip
        except FailedPrecondition as exc:
            log.info("not recovering %s: %s", e.id, exc)

    def autosave_failed(self, e: Episode, problem: str) -> None:
        # The next autosave waits half a period, so an unreachable node is not asked every tick.
        retry_at = time.time() + max(self.settings.retry_backoff_s, e.spec.preemption.autosave_s / 2)
        self.store.episodes.update(
            e.id,
            pending_snapshot_id="",
            pending_reason="",
            not_before=retry_at,
            decision=f"autosave failed: {problem}",
        )

    def snapshot_committed(self, e: Episode, record: SnapshotRecord, leave_running: bool) -> None:
        """Record a committed snapshot and finish the checkpoint's transition."""
        if leave_running:
            self.store.snapshots.add(
                record, pending_snapshot_id="", pending_reason="", last_autosave_at=time.time()
            )
            return
        held = e.pending_reason in (Reason.MANUAL, Reason.FORK)  # a fork that stops it: held too
        try:
            self.store.episodes.transition(
                e.id, S.PREEMPTED, f"{e.pending_reason}: snapshot {record.id} stored{_moments(record)}" + ("; held until resumed" if held else ""),
                expect=(S.CHECKPOINTING,), snapshot=record, node="", sandbox_id="", pending_snapshot_id="",
                pending_reason="", held=held, queued_at=time.time(), pinned_node="",
            )  # fmt: skip
        except FailedPrecondition:
            self.store.snapshots.add(record, pending_snapshot_id="", pending_reason="")
        # The agent stops the sandbox after committing; make sure nothing is left if it could not.
        if e.node and e.sandbox_id:
            self.members.delete_quietly(e.node, e.sandbox_id)

    def record_if_committed(self, e: Episode, leave_running: bool) -> bool:
        """If the pending snapshot is in the store (the agent's reply was lost), record it from
        its manifest, with the digest of the manifest as read now, and finish the transition.

        The node's reply, which would have carried the digest, is lost: what the store holds is
        taken as the node's only if it is the snapshot asked of that node (episode, sequence,
        parent, node). A writer with the store's credentials who replaced it between the node's
        commit and this read is the trust left open here (docs/security.md)."""
        try:
            manifest = self.snapshots.manifest(e.pending_snapshot_id)
        except SnapshotError:
            return False
        pending = ids.SnapshotId.parse(e.pending_snapshot_id)
        asked = (e.id, pending.sequence if pending else 0, e.snapshot_parent or None, e.node)
        found = (manifest.episode_id, manifest.seq, manifest.parent_id, manifest.node)
        if found != asked:
            log.warning(
                "snapshot %s in the store is not the one asked of node %s (episode, sequence, "
                "parent, node: %s, asked %s); not recorded", e.pending_snapshot_id, e.node, found, asked,
            )  # fmt: skip
            return False
        record = SnapshotRecord(
            id=manifest.snapshot_id,
            episode_id=e.id,
            sequence=manifest.seq,
            parent_id=manifest.parent_id or "",
            node=manifest.node,
            reason=str(manifest.reason),
            created_at=manifest.created_at.timestamp(),
            logical_bytes=manifest.sizes.logical_bytes,
            stored_bytes=manifest.sizes.stored_bytes,
            new_bytes=manifest.sizes.new_bytes,
            trajectory_cursor=manifest.trajectory_cursor,
            timings_ms=dict(manifest.timings_ms),
            manifest_digest=manifest.digest,
        )
        self.snapshot_committed(e, record, leave_running)
        return True


def _moments(record: SnapshotRecord) -> str:
    """When the node was free and the snapshot durable, counted from the freeze, as the node saw it."""
    t = record.timings_ms
    if "node_free_ms" not in t or "durable_ms" not in t:
        return ""
    return f" (frozen {t.get('frozen_ms', 0):.0f} ms, node free after {t['node_free_ms']:.0f} ms, durable after {t['durable_ms']:.0f} ms)"


def frozen_at(outcome: CheckpointOutcome) -> float:
    """When the sandbox froze, by this orchestrator's clock, which also stamps each delivery of a
    turn: the two are compared to tell what a restored harness had (`Ledger.record`). The node's
    clock may be off by any amount; how long before its reply the sandbox froze is not. Called as
    the reply arrives, so off by the reply's time on the wire; the node's clock is the fallback
    for an agent that does not say."""
    if outcome.since_freeze_ms > 0:
        return time.time() - outcome.since_freeze_ms / 1000
    return outcome.created_at


def snapshot_record(e: Episode, target: SnapshotTarget, outcome: CheckpointOutcome) -> SnapshotRecord:
    """The record of a snapshot a node reported committed."""
    return SnapshotRecord(
        id=outcome.snapshot_id,
        episode_id=e.id,
        sequence=target.sequence,
        parent_id=target.parent_id,
        node=e.node,
        reason=target.reason,
        created_at=frozen_at(outcome),
        logical_bytes=outcome.logical_bytes,
        stored_bytes=outcome.stored_bytes,
        new_bytes=outcome.new_bytes,
        trajectory_cursor=target.trajectory_cursor,
        timings_ms=outcome.timings_ms,
        manifest_digest=outcome.manifest_digest,
    )
