"""Operations on nodes: start, restore, checkpoint and finish an episode.

What ends an episode for good, and what a GRPO group's member gets instead (docs/trajectory.md,
"GRPO groups"): its group is lost with it, so a member is never ended by the infrastructure.
  * Its node lost, or its sandbox gone: back to its last snapshot, or to the start (`recover`),
    however often, for any episode.
  * An upstream outage: a member whose harness exits when the last thing its run had from the
    gateway was a failure of the model server (`trajectory.outages`) is not graded on the run
    the outage cut short; it goes back to its last snapshot, or to the start, up to
    `group_max_attempts` times, then fails naming the outage.
  * A start the agent could not make (unreachable: retried without end; refused for a reason
    that may be the node's): failed after `max_attempts`, a member after `group_max_attempts`.
  * A restore that keeps failing, or whose snapshots are all gone or unverifiable: failed, but a
    member starts over from the beginning instead (`Outcomes.restore_failed`).
  * A spec the node refuses (`SpecRefused`), an image that does not exist, a harness that exits
    with an error, a verifier that prints no reward, a cancel: final for members too. Their group
    cannot complete, and says so.
No reward is ever made up: a member's reward is its verifier's, of a run that ended.

Each first commits its intent (a placement with the sandbox id it will create, RESTORING, or
CHECKPOINTING with the snapshot id it will write), then calls the node's agent from a worker,
then commits the outcome. An intent found with no worker behind it after a restart is settled
by `settle`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from orchestrator.control.membership import Membership
from orchestrator.control.node_agent import (
    ForkMark,
    NodeAgents,
    RestoreIdentity,
    SandboxConflict,
    SnapshotDamaged,
    SnapshotTarget,
    SpecRefused,
)
from orchestrator.control.outcomes import Outcomes, snapshot_record
from orchestrator.control.settings import ControlSettings
from orchestrator.control.work import Work
from orchestrator.domain import (
    Episode,
    EpisodeState,
    FailedPrecondition,
    NotFound,
    PermanentError,
    Reason,
    StasisError,
    TemporaryError,
    ids,
)
from orchestrator.state import StateStore
from orchestrator.trajectory import Ledger
from snapshots import SnapshotStore

log = logging.getLogger(__name__)
S = EpisodeState

CursorHook = Callable[[Episode], Any]
"""The trajectory ledger's position, stored with each snapshot."""
FinishHook = Callable[[Episode, int | None], tuple[EpisodeState, str, float | None]]
"""What runs when a harness exits (the verifier): the final state, its reason and the reward."""
EnvHook = Callable[[Episode], dict[str, str]]
"""Environment a sandbox gets beside its spec's (the gateway's address and the episode's key)."""


KEPT_LOG_BYTES = 4 << 20


def default_finish(episode: Episode, exit_code: int | None) -> tuple[EpisodeState, str, float | None]:
    if exit_code == 0:
        return S.SUCCEEDED, "harness exited with code 0", None
    return S.FAILED, f"harness exited with code {exit_code}", None


class Operations:
    def __init__(
        self,
        settings: ControlSettings,
        store: StateStore,
        snapshots: SnapshotStore,
        agents: NodeAgents,
        work: Work,
        members: Membership,
        outcomes: Outcomes,
        *,
        cursor: CursorHook,
        finish: FinishHook,
        env: EnvHook,
        ledger: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.snapshots = snapshots
        self.agents = agents
        self.work = work
        self.members = members
        self.outcomes = outcomes
        self._cursor = cursor
        self._finish = finish
        self._env = env
        self.ledger = ledger
        """Where the gateway notes the runs the model server failed; None: no gateway."""

    # start ---------------------------------------------------------------------------------

    def begin_start(self, e: Episode, node: str, why: str) -> None:
        run = e.runs + 1
        try:
            with self.work.claim(e.id):
                self.store.episodes.update(
                    e.id, node=node, sandbox_id=ids.sandbox_id(e.id, run), runs=run, restored_from="",
                    decision=why,
                )  # fmt: skip
                self.work.submit(e.id, self.start)
        except (FailedPrecondition, RuntimeError):
            return

    def start(self, e: Episode) -> None:
        env = {"STASIS_EPISODE_ID": e.id, **self._env(e)}
        try:
            view = self.agents.get(e.node).create(
                e.sandbox_id, e.spec, address=e.address, hostname=e.id, env=env
            )
        except TemporaryError as exc:
            self.outcomes.start_failed(e, str(exc), final=False, exc=exc)
            return
        except (PermanentError, NotFound) as exc:
            # A bad image or spec fails the same way everywhere; anything else may be this node.
            final = isinstance(exc, NotFound | SpecRefused) or self.outcomes.gives_up(e)
            self.outcomes.start_failed(e, str(exc), final=final)
            return
        pulled = view.timings_ms.get("pull_ms", 0.0)
        self.outcomes.running(
            e, S.PENDING, f"started on {e.node}" + (f" (pulled {e.spec.image} in {pulled:.0f} ms)" if pulled else ""),
            log_offsets=e.with_run_log(e.runs, 0, fresh=True),
        )  # fmt: skip

    # restore -------------------------------------------------------------------------------

    def begin_restore(self, e: Episode, node: str, why: str) -> None:
        if not e.last_snapshot_id:
            self.store.episodes.transition(
                e.id, S.PENDING, "no snapshot to resume from; starting over", queued_at=time.time()
            )
            return
        run = e.runs + 1
        try:
            with self.work.claim(e.id):
                self.store.episodes.transition(
                    e.id, S.RESTORING, why, expect=(S.PREEMPTED,), node=node,
                    sandbox_id=ids.sandbox_id(e.id, run), runs=run, restored_from=e.last_snapshot_id,
                )  # fmt: skip
                self.work.submit(e.id, self.restore)
        except (FailedPrecondition, RuntimeError):
            return

    def restore(self, e: Episode) -> None:
        where = f"restore on {e.node} failed"
        record = self.store.snapshots.get(e.last_snapshot_id)
        digest = record.manifest_digest if record is not None else ""
        if not digest:
            # Recorded before manifests were digested: nothing vouches for what the store holds.
            problem = "has no recorded manifest digest, so its manifest cannot be verified"
            if not self._fall_back(e, problem):
                self.outcomes.restore_failed(
                    e, f"snapshot {e.last_snapshot_id} {problem}; it is not restored", final=True
                )
            return
        try:
            view = self.agents.get(e.node).restore(
                e.sandbox_id, e.last_snapshot_id, digest, e.spec.image, self._identity(e)
            )
        except TemporaryError as exc:
            self.outcomes.restore_failed(e, f"{where}, will retry: {exc}", final=False, exc=exc)
            return
        except PermanentError as exc:
            if isinstance(exc, SnapshotDamaged) and self._fall_back(e, f"is corrupt ({exc})"):
                return
            final = self.outcomes.gives_up(e, member_limit=False)
            self.outcomes.restore_failed(e, f"{where}: {exc}", final=final)
            return
        except NotFound as exc:
            if not self._fall_back(e, f"is gone ({exc})"):
                self.outcomes.restore_failed(e, f"{where}: {exc}", final=True)
            return
        timings = ", ".join(f"{k} {v:.0f}" for k, v in view.timings_ms.items() if v)
        self.outcomes.running(
            e, S.RESTORING, f"restored on {e.node} from {e.last_snapshot_id} ({timings} ms)",
            log_offsets=e.with_run_log(e.runs, view.log_start, fresh=False),
        )  # fmt: skip

    def _identity(self, e: Episode) -> RestoreIdentity:
        """Who the restored sandbox is: the episode's address and host name, which a fork child
        does not share with the episode that took its snapshot; and, restoring that snapshot,
        its `ForkMark`."""
        fork = None
        if e.restores_its_fork:
            fork = ForkMark(
                episode_id=e.id, parent_episode_id=e.fork_parent, snapshot_id=e.forked_from,
                index=e.fork_index, count=self.store.snapshots.fork_size(e.forked_from),
            )  # fmt: skip
        return RestoreIdentity(address=e.address, hostname=e.id, fork=fork, egress=e.spec.egress)

    def _fall_back(self, e: Episode, problem: str) -> bool:
        """A snapshot that cannot be restored never ends an episode that has a good one: resume
        from the newest snapshot before it that was recorded with its manifest's digest and that
        the store still holds; a fork child's line goes back to the snapshot it was forked from.
        Only the records' lineage is followed, never a manifest's."""
        at = self.store.snapshots.get(e.last_snapshot_id)
        # Before a child's first snapshot of its own comes its fork's.
        parent = (at.parent_id or e.forked_from) if at is not None and not e.restores_its_fork else ""
        while parent:
            record = self.store.snapshots.get(parent)
            if record is not None and record.manifest_digest and self.snapshots.exists(parent):
                break
            # A child's own line ends at its fork's snapshot; never past it: what the parent was
            # before it is not the child's.
            parent = "" if parent == e.forked_from else (record.parent_id if record else "") or e.forked_from
        if not parent:
            return False
        self.outcomes.transition_or_cleanup(
            e, S.PREEMPTED, f"snapshot {e.last_snapshot_id} {problem}; falling back to {parent}",
            expect=(S.RESTORING,), node="", sandbox_id="", last_snapshot_id=parent,
        )  # fmt: skip
        return True

    # checkpoint ----------------------------------------------------------------------------

    def begin_checkpoint(
        self, episode_id: str, reason: Reason, why: str, *, leave_running: bool = False
    ) -> Episode:
        """Commit the intent to checkpoint and start it; returns the episode as it is now."""
        _require_running(self.store.episodes.get(episode_id))  # a clear answer before a "busy" one
        with self.work.claim(episode_id):
            e = self.store.episodes.get(episode_id)
            _require_running(e)
            sequence = e.snapshots + 1
            while self.snapshots.exists(
                ids.snapshot_id(e.id, sequence)
            ):  # left by a crash before it was recorded
                sequence += 1
            snapshot_id = ids.snapshot_id(e.id, sequence)
            if leave_running:
                e = self.store.episodes.update(
                    e.id, pending_snapshot_id=snapshot_id, pending_reason=str(reason), decision=why
                )
            else:
                e = self.store.episodes.transition(
                    e.id, S.CHECKPOINTING, f"{reason}: {why}", expect=(S.RUNNING,),
                    pending_snapshot_id=snapshot_id, pending_reason=str(reason),
                )  # fmt: skip
            self.work.submit(e.id, self.checkpoint, leave_running)
            return e

    def checkpoint(self, e: Episode, leave_running: bool) -> None:
        """Ask the node for the pending snapshot and commit what happened."""
        pending = ids.SnapshotId.parse(e.pending_snapshot_id)
        assert pending is not None, f"episode {e.id} has no pending snapshot"
        target = SnapshotTarget(
            snapshot_id=e.pending_snapshot_id,
            episode_id=e.id,
            sequence=pending.sequence,
            parent_id=e.snapshot_parent,
            reason=e.pending_reason,
            trajectory_cursor=self._cursor(e),
        )
        try:
            outcome = self.agents.get(e.node).checkpoint(e.sandbox_id, target, leave_running=leave_running)
        except StasisError as exc:
            # A node that found the snapshot's id taken wrote nothing: what holds it is not its.
            if not isinstance(exc, SandboxConflict) and self.outcomes.record_if_committed(e, leave_running):
                return
            if leave_running:
                self.outcomes.autosave_failed(e, str(exc))
            elif isinstance(exc, TemporaryError):
                log.warning("checkpoint of %s: agent unreachable (%s); will settle", e.id, exc)
                # CHECKPOINTING with no worker behind it: settling finds out what happened.
            else:
                self.outcomes.transition_or_cleanup(
                    e, S.RUNNING, f"checkpoint failed, still running: {exc}", expect=(S.CHECKPOINTING,),
                    pending_snapshot_id="", pending_reason="", run_started_at=time.time(),
                )  # fmt: skip
            return
        self.outcomes.snapshot_committed(e, snapshot_record(e, target, outcome), leave_running)

    # finishing -----------------------------------------------------------------------------

    def complete(self, e: Episode, exit_code: int | None) -> None:
        if self._cut_short(e, exit_code):
            return
        try:
            state, reason, reward = self._finish(e, exit_code)
        except TemporaryError as exc:
            log.warning("finishing %s must wait: %s", e.id, exc)
            return
        except PermanentError as exc:
            state, reason, reward = S.FAILED, str(exc), None
        self._keep_log(e)
        self.outcomes.transition_or_cleanup(
            e, state, reason, expect=(S.RUNNING,), exit_code=exit_code, reward=reward
        )
        self.members.delete_quietly(e.node, e.sandbox_id)

    def _cut_short(self, e: Episode, exit_code: int | None) -> bool:
        """Whether the member's run ended on an upstream outage, and was sent back to its last
        snapshot or the start (or failed, naming the outage, past `group_max_attempts`)."""
        if self.ledger is None or not e.group_id:
            return False
        outage = self.ledger.outages.cut_short(e.id, e.runs)
        if outage is None:
            return False
        why = f"harness exited with code {exit_code} after the model server failed its run: {outage.why}"
        if outage.reruns + 1 >= self.settings.group_max_attempts:
            self.fail_run(e, f"{why}; {outage.reruns + 1} runs ended so, past group_max_attempts")
            return True
        self.ledger.outages.rerun(e.id, e.runs)
        self.outcomes.recover(e, why)
        self.members.delete_quietly(e.node, e.sandbox_id)
        return True

    def _keep_log(self, e: Episode) -> None:
        """The harness log outlives the sandbox, up to its last KEPT_LOG_BYTES."""
        try:
            content, size = self.agents.get(e.node).harness_log(e.sandbox_id, tail_bytes=KEPT_LOG_BYTES)
        except StasisError as exc:
            log.warning("the log of %s is lost with its sandbox: %s", e.id, exc)
            return
        self.store.logs.put(e.id, size - len(content), content)

    def fail_run(self, e: Episode, reason: str) -> None:
        self.outcomes.transition_or_cleanup(e, S.FAILED, reason, expect=(S.RUNNING,))
        self.members.delete_quietly(e.node, e.sandbox_id)


def _require_running(e: Episode) -> None:
    if e.state != S.RUNNING:
        raise FailedPrecondition(f"episode {e.id} is {e.state}; only RUNNING episodes can be checkpointed")
