"""The control loop: observes nodes and sandboxes, applies the scheduler's decisions, and settles
operations that a crash interrupted.

Every operation first commits its intent (CHECKPOINTING with the snapshot id it will write,
RESTORING or a placement with the sandbox id it will create), then calls the agent from a worker
thread, then commits the outcome. An operation found in an intent state with no worker behind it
(after a restart) is settled by asking the agent and the snapshot store what really happened.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from orchestrator import scheduler
from orchestrator.agents import AgentPool, AgentRefused, SandboxView
from orchestrator.errors import FailedPrecondition, NotFound, PermanentError, StasisError, TemporaryError
from orchestrator.model import (
    TERMINAL,
    Episode,
    EpisodeState,
    NodeRecord,
    NodeState,
    Reason,
    SnapshotRecord,
    address_pool,
)
from orchestrator.settings import OrchestratorSettings
from orchestrator.store import StateStore
from snapshots import RetentionPolicy, SnapshotError, SnapshotStore

log = logging.getLogger(__name__)

ACTIVE = tuple(s for s in EpisodeState if s not in TERMINAL)
S = EpisodeState

# Hooks the trajectory ledger plugs in: the cursor stored with each snapshot, and what runs when a
# harness exits (the verifier); both optional so the control plane runs without a gateway.
CursorHook = Callable[[Episode], Any]
FinishHook = Callable[[Episode, int | None], tuple[EpisodeState, str, float | None]]


def default_finish(episode: Episode, exit_code: int | None) -> tuple[EpisodeState, str, float | None]:
    if exit_code == 0:
        return S.SUCCEEDED, "harness exited with code 0", None
    return S.FAILED, f"harness exited with code {exit_code}", None


class Control:
    def __init__(
        self,
        settings: OrchestratorSettings,
        store: StateStore,
        snapshots: SnapshotStore,
        agents: AgentPool | None = None,
        *,
        cursor: CursorHook | None = None,
        finish: FinishHook = default_finish,
        gateway_env: Callable[[Episode], dict[str, str]] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.snapshots = snapshots
        self.agents = agents or AgentPool()
        self.pool_of_addresses = address_pool(settings.address_pool)
        self._cursor = cursor or (lambda e: None)
        self._finish = finish
        self._gateway_env = gateway_env or (lambda e: {})
        self._lock = threading.RLock()
        self._busy: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._workers = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="control")
        self._thread = threading.Thread(target=self._run, name="control-loop", daemon=True)
        started = time.time()
        # Restarted: every known node gets a full grace period before it can be declared lost.
        self._heartbeats: dict[str, float] = {n.name: started for n in store.nodes()}
        self._reports: dict[str, tuple[float, dict[str, SandboxView]]] = {}
        self._last_gc = started
        for n in store.nodes():
            self.agents.set(n.name, n.address)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._workers.shutdown(wait=True, cancel_futures=True)
        self.agents.close()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.tick()
            except Exception:
                log.exception("control loop tick failed")
            self._wake.wait(self.settings.tick_s)

    # -- nodes ------------------------------------------------------------------------------

    def node_registered(self, node: NodeRecord, sandboxes: list[SandboxView]) -> NodeRecord:
        node.last_heartbeat = time.time()
        saved = self.store.upsert_node(node)
        if saved.state == NodeState.LOST:
            saved = self.store.set_node_state(node.name, NodeState.READY, "node is back")
        self.agents.set(node.name, node.address)
        self.heartbeat(node.name, sandboxes, node.images)
        return saved

    def heartbeat(self, name: str, sandboxes: list[SandboxView], images: dict[str, list[str]]) -> bool:
        try:
            node = self.store.node(name)
        except NotFound:
            return False
        now = time.time()
        with self._lock:
            self._heartbeats[name] = now
            self._reports[name] = (now, {s.id: s for s in sandboxes})
        if node.state == NodeState.LOST:
            self.store.set_node_state(name, NodeState.READY, "heartbeats resumed")
        if images != node.images:
            self.store.update_node_images(name, images)
        self._fence(name, sandboxes)
        self.wake()
        return True

    def last_heartbeat(self, name: str) -> float:
        with self._lock:
            return self._heartbeats.get(name, 0.0)

    def _fence(self, node: str, sandboxes: list[SandboxView]) -> None:
        """Delete sandboxes of episodes that moved on (e.g. after this node was lost), so no
        episode ever runs twice."""
        with self._lock:
            busy = set(self._busy)
        expected = {e.sandbox_id for e in self.store.query(states=ACTIVE, node=node)}
        for s in sandboxes:
            episode_id = s.id.rsplit("-r", 1)[0]
            if not s.id.startswith("ep-") or s.id in expected or episode_id in busy or s.busy:
                continue
            log.warning("node %s still holds stale sandbox %s; deleting it", node, s.id)
            self._workers.submit(self._delete_quietly, node, s.id)

    def _delete_quietly(self, node: str, sandbox_id: str) -> None:
        try:
            self.agents.get(node).delete(sandbox_id)
        except StasisError as exc:
            log.warning("could not delete sandbox %s on node %s: %s", sandbox_id, node, exc)

    def _check_liveness(self, now: float) -> None:
        for node in self.store.nodes():
            if node.state == NodeState.LOST:
                continue
            with self._lock:
                last = self._heartbeats.setdefault(node.name, now)
            if now - last > self.settings.node_lost_after_s:
                self.store.set_node_state(node.name, NodeState.LOST, f"no heartbeat for {now - last:.0f}s")
                for e in self.store.query(states=ACTIVE, node=node.name):
                    if e.id not in self._busy and e.state in (
                        S.RUNNING,
                        S.CHECKPOINTING,
                        S.RESTORING,
                        S.PENDING,
                    ):
                        self._recover(e, f"node {node.name} was lost")

    # -- the loop ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.time()
        self._check_liveness(now)
        nodes = {n.name: n for n in self.store.nodes()}
        episodes = self.store.query(states=ACTIVE)
        for e in episodes:
            if e.id not in self._busy:
                self._observe(e, nodes, now)
        episodes = self.store.query(states=ACTIVE)
        with self._lock:
            busy = set(self._busy)
        for decision in scheduler.plan(episodes, nodes.values(), now, busy):
            self._apply(decision)
        if now - self._last_gc >= self.settings.gc_interval_s:
            self._last_gc = now
            self._workers.submit(self.collect_snapshots)

    def _observe(self, e: Episode, nodes: dict[str, NodeRecord], now: float) -> None:
        node = nodes.get(e.node)
        if e.node and (node is None or node.state == NodeState.LOST):
            if e.state in (S.RUNNING, S.CHECKPOINTING, S.RESTORING, S.PENDING):
                self._recover(e, f"node {e.node} was lost")
            return
        if e.state == S.RUNNING:
            limit = e.spec.limits.max_wall_s
            if limit and e.total_run_s(now) > limit:
                self._begin(
                    e, self._fail_run, f"ran {e.total_run_s(now):.0f}s, past limits.max_wall_s={limit:.0f}"
                )
                return
            if e.pending_snapshot_id:
                self._begin(e, self._settle_autosave)
                return
            with self._lock:
                reported_at, report = self._reports.get(e.node, (0.0, {}))
            sandbox = report.get(e.sandbox_id)
            if sandbox is not None and sandbox.state == "exited" and not sandbox.busy:
                self._begin(e, self._complete, sandbox.exit_code)
            elif sandbox is None and reported_at > e.updated_at + 2 * self.settings.heartbeat_interval_s:
                self._begin(e, self._settle_missing)
        elif e.state == S.CHECKPOINTING:
            self._begin(e, self._settle_checkpoint)
        elif e.state == S.RESTORING or (e.state == S.PENDING and e.node):
            self._begin(e, self._settle_start)

    def _apply(self, decision: scheduler.Decision) -> None:
        e = decision.episode
        if isinstance(decision, scheduler.Checkpoint):
            self.checkpoint(e.id, decision.reason, decision.why, leave_running=decision.leave_running)
        elif isinstance(decision, scheduler.Restore):
            self._begin_restore(e, decision.node, decision.why)
        else:
            self._begin_start(e, decision.node, decision.why)

    # -- running work -----------------------------------------------------------------------

    @contextmanager
    def _claim(self, episode_id: str) -> Iterator[None]:
        with self._lock:
            if episode_id in self._busy:
                raise FailedPrecondition(
                    f"episode {episode_id} has an operation in progress; try again shortly"
                )
            self._busy.add(episode_id)
        try:
            yield
        except BaseException:
            self._release(episode_id)
            raise

    def _release(self, episode_id: str) -> None:
        with self._lock:
            self._busy.discard(episode_id)
        self.wake()

    def _begin(self, e: Episode, work: Callable[..., None], *args: Any) -> None:
        """Run work(episode, *args) on a worker; at most one operation per episode at a time."""
        try:
            with self._claim(e.id):
                self._workers.submit(self._guarded, e.id, work, *args)
        except FailedPrecondition:
            return
        except RuntimeError:  # shutting down
            self._release(e.id)

    def _guarded(self, episode_id: str, work: Callable[..., None], *args: Any) -> None:
        try:
            work(self.store.get(episode_id), *args)
        except Exception:
            log.exception("operation %s on episode %s failed", work.__name__, episode_id)
        finally:
            self._release(episode_id)

    def _backoff(self, e: Episode) -> float:
        return time.time() + self.settings.retry_backoff_s * 2 ** min(e.attempts, 6)

    def _env(self, e: Episode) -> dict[str, str]:
        return {"STASIS_EPISODE_ID": e.id, **self._gateway_env(e)}

    # start ---------------------------------------------------------------------------------

    def _begin_start(self, e: Episode, node: str, why: str) -> None:
        sandbox_id = f"{e.id}-r{e.runs + 1}"
        try:
            with self._claim(e.id):
                e = self.store.update(
                    e.id, node=node, sandbox_id=sandbox_id, runs=e.runs + 1, restored_from="", decision=why
                )
                self._workers.submit(self._guarded, e.id, self._start)
        except (FailedPrecondition, RuntimeError):
            return

    def _start(self, e: Episode) -> None:
        try:
            self.agents.get(e.node).create(
                e.sandbox_id, e.spec, address=e.address, hostname=e.id, env=self._env(e)
            )
        except TemporaryError as exc:
            self.store.update(
                e.id, node="", sandbox_id="", attempts=e.attempts + 1, not_before=self._backoff(e),
                decision=f"start on {e.node} failed, will retry: {exc}",
            )  # fmt: skip
            return
        except (PermanentError, NotFound) as exc:
            self._start_failed(e, exc)
            return
        self._running(e, S.PENDING, f"started on {e.node}")

    def _start_failed(self, e: Episode, exc: Exception) -> None:
        # A bad image or spec fails the same way everywhere; anything else may be this node.
        final = (
            isinstance(exc, NotFound)
            or (isinstance(exc, AgentRefused) and exc.code == "INVALID_ARGUMENT")
            or e.attempts + 1 >= self.settings.max_attempts
        )
        if final:
            self._transition_or_cleanup(e, S.FAILED, f"could not start: {exc}", node="", sandbox_id="")
        else:
            self.store.update(
                e.id, node="", sandbox_id="", attempts=e.attempts + 1, not_before=self._backoff(e),
                decision=f"start on {e.node} failed, will retry: {exc}",
            )  # fmt: skip

    def _running(self, e: Episode, expect: EpisodeState, reason: str) -> None:
        self._transition_or_cleanup(
            e, S.RUNNING, reason, expect=(expect,), run_started_at=time.time(), attempts=0, not_before=0.0
        )

    def _transition_or_cleanup(
        self, e: Episode, to: EpisodeState, reason: str, expect: tuple[EpisodeState, ...] = (), **changes: Any
    ) -> None:
        """Commit the outcome; if the episode moved on meanwhile (cancelled), remove its sandbox."""
        try:
            self.store.transition(e.id, to, reason, expect=expect, **changes)
        except FailedPrecondition as exc:
            log.info("episode %s moved on during an operation (%s); removing its sandbox", e.id, exc)
            if e.node and e.sandbox_id:
                self._delete_quietly(e.node, e.sandbox_id)

    # restore -------------------------------------------------------------------------------

    def _begin_restore(self, e: Episode, node: str, why: str) -> None:
        if not e.last_snapshot_id:
            self.store.transition(
                e.id, S.PENDING, "no snapshot to resume from; starting over", queued_at=time.time()
            )
            return
        try:
            with self._claim(e.id):
                self.store.transition(
                    e.id, S.RESTORING, why, expect=(S.PREEMPTED,), node=node,
                    sandbox_id=f"{e.id}-r{e.runs + 1}", runs=e.runs + 1, restored_from=e.last_snapshot_id,
                )  # fmt: skip
                self._workers.submit(self._guarded, e.id, self._restore)
        except (FailedPrecondition, RuntimeError):
            return

    def _restore(self, e: Episode) -> None:
        try:
            view = self.agents.get(e.node).restore(e.sandbox_id, e.last_snapshot_id, e.spec.image)
        except TemporaryError as exc:
            self._restore_failed(e, f"restore on {e.node} failed, will retry: {exc}", final=False)
            return
        except AgentRefused as exc:
            if exc.code == "DATA_LOSS" and self._fall_back(e, str(exc)):
                return
            final = e.attempts + 1 >= self.settings.max_attempts
            self._restore_failed(e, f"restore on {e.node} failed: {exc}", final=final)
            return
        except NotFound as exc:
            self._restore_failed(e, f"restore on {e.node} failed: {exc}", final=True)
            return
        timings = ", ".join(f"{k} {v:.0f}" for k, v in view.restore_timings.items() if v)
        self._running(e, S.RESTORING, f"restored on {e.node} from {e.last_snapshot_id} ({timings} ms)")

    def _restore_failed(self, e: Episode, reason: str, *, final: bool) -> None:
        if final:
            self._transition_or_cleanup(e, S.FAILED, reason, node="", sandbox_id="")
        else:
            self._transition_or_cleanup(
                e, S.PREEMPTED, reason, expect=(S.RESTORING,), node="", sandbox_id="",
                attempts=e.attempts + 1, not_before=self._backoff(e),
            )  # fmt: skip

    def _fall_back(self, e: Episode, problem: str) -> bool:
        """A corrupt snapshot never replaces a good one: resume from its parent instead."""
        records = self.store.snapshots(e.id)
        parent = next((r.parent_id for r in records if r.id == e.last_snapshot_id), "")
        if not parent:
            return False
        self._transition_or_cleanup(
            e, S.PREEMPTED, f"snapshot {e.last_snapshot_id} is corrupt ({problem}); falling back to {parent}",
            expect=(S.RESTORING,), node="", sandbox_id="", last_snapshot_id=parent,
        )  # fmt: skip
        return True

    # checkpoint ----------------------------------------------------------------------------

    def checkpoint(
        self, episode_id: str, reason: Reason, why: str, *, leave_running: bool = False
    ) -> Episode:
        """Commit the intent to checkpoint and start it; returns the episode as it is now."""
        _require_running(self.store.get(episode_id))  # a clear answer before a "busy" one
        with self._claim(episode_id):
            e = self.store.get(episode_id)
            _require_running(e)
            sequence = e.snapshots + 1
            snapshot_id = f"{e.id}-s{sequence}"
            while self.snapshots.exists(snapshot_id):  # left by a crash before it was recorded
                sequence += 1
                snapshot_id = f"{e.id}-s{sequence}"
            if leave_running:
                e = self.store.update(
                    e.id, pending_snapshot_id=snapshot_id, pending_reason=str(reason), decision=why
                )
            else:
                e = self.store.transition(
                    e.id, S.CHECKPOINTING, f"{reason}: {why}", expect=(S.RUNNING,),
                    pending_snapshot_id=snapshot_id, pending_reason=str(reason),
                )  # fmt: skip
            try:
                self._workers.submit(self._guarded, e.id, self._checkpoint, sequence, leave_running)
            except RuntimeError:
                self._release(episode_id)
                raise
            return e

    def _checkpoint(self, e: Episode, sequence: int, leave_running: bool) -> None:
        try:
            self.agents.get(e.node).checkpoint(
                e.sandbox_id,
                snapshot_id=e.pending_snapshot_id,
                episode_id=e.id,
                sequence=sequence,
                parent_id=e.last_snapshot_id,
                reason=e.pending_reason,
                trajectory_cursor=self._cursor(e),
                leave_running=leave_running,
            )
        except StasisError as exc:
            if self._record_if_committed(e, leave_running):
                return
            if leave_running:
                self._autosave_failed(e, str(exc))
            elif isinstance(exc, TemporaryError):
                log.warning("checkpoint of %s: agent unreachable (%s); will settle", e.id, exc)
                # CHECKPOINTING with no worker behind it: _settle_checkpoint finds out what happened.
            else:
                self._transition_or_cleanup(
                    e, S.RUNNING, f"checkpoint failed, still running: {exc}", expect=(S.CHECKPOINTING,),
                    pending_snapshot_id="", pending_reason="", run_started_at=time.time(),
                )  # fmt: skip
            return
        self._record_if_committed(e, leave_running)

    def _record_if_committed(self, e: Episode, leave_running: bool) -> bool:
        """If the pending snapshot is in the store, record it and finish the transition."""
        try:
            manifest = self.snapshots.manifest(e.pending_snapshot_id)
        except SnapshotError:
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
        )
        if leave_running:
            self.store.add_snapshot(
                record, pending_snapshot_id="", pending_reason="", last_autosave_at=time.time()
            )
            return True
        held = e.pending_reason == Reason.MANUAL
        try:
            self.store.transition(
                e.id, S.PREEMPTED, f"{e.pending_reason}: snapshot {record.id} stored" + ("; held until resumed" if held else ""),
                expect=(S.CHECKPOINTING,), snapshot=record, node="", sandbox_id="", pending_snapshot_id="",
                pending_reason="", held=held, queued_at=time.time(), pinned_node="",
            )  # fmt: skip
        except FailedPrecondition:
            self.store.add_snapshot(record, pending_snapshot_id="", pending_reason="")
        # The agent stops the sandbox after committing; make sure nothing is left if it could not.
        if e.node and e.sandbox_id:
            self._delete_quietly(e.node, e.sandbox_id)
        return True

    # settling after a crash or a lost reply ------------------------------------------------

    def _settle_checkpoint(self, e: Episode) -> None:
        if self._record_if_committed(e, leave_running=False):
            return
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return  # ask again next tick; a lost node is handled by liveness
        if sandbox is None:
            self._recover(e, f"sandbox {e.sandbox_id} vanished during a checkpoint")
        elif sandbox.busy or sandbox.state == "paused":
            return  # the agent is still at it
        else:
            # The intent was committed but the checkpoint never ran (the request died with the
            # orchestrator): carry it out now rather than drop what was asked for.
            sequence = int(e.pending_snapshot_id.rsplit("-s", 1)[1])
            self._checkpoint(e, sequence, leave_running=False)

    def _settle_autosave(self, e: Episode) -> None:
        if not self._record_if_committed(e, leave_running=True):
            self._autosave_failed(e, "it did not complete")

    def _autosave_failed(self, e: Episode, problem: str) -> None:
        # The next autosave waits half a period, so an unreachable node is not asked every tick.
        retry_at = time.time() + max(self.settings.retry_backoff_s, e.spec.preemption.autosave_s / 2)
        self.store.update(
            e.id,
            pending_snapshot_id="",
            pending_reason="",
            not_before=retry_at,
            decision=f"autosave failed: {problem}",
        )

    def _settle_start(self, e: Episode) -> None:
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return
        if sandbox is not None and sandbox.busy:
            return
        if sandbox is not None:
            self._running(e, e.state, f"{'restored' if e.state == S.RESTORING else 'started'} on {e.node}")
        elif e.state == S.RESTORING:
            self._restore_failed(e, f"restore on {e.node} did not complete", final=False)
        else:
            self.store.update(e.id, node="", sandbox_id="", decision=f"start on {e.node} did not complete")

    def _settle_missing(self, e: Episode) -> None:
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return
        if sandbox is None:
            self._recover(e, f"sandbox {e.sandbox_id} disappeared from node {e.node}")

    def _recover(self, e: Episode, why: str) -> None:
        """Send an episode back to its last snapshot, or to the start if it has none."""
        try:
            if e.last_snapshot_id:
                self.store.transition(
                    e.id, S.PREEMPTED, f"{why}; resuming from snapshot {e.last_snapshot_id}", node="",
                    sandbox_id="", pending_snapshot_id="", pending_reason="", queued_at=time.time(), held=False,
                )  # fmt: skip
            else:
                self.store.transition(
                    e.id, S.PENDING, f"{why}; no snapshot yet, starting over", node="", sandbox_id="",
                    pending_snapshot_id="", pending_reason="", queued_at=time.time(),
                )  # fmt: skip
        except FailedPrecondition as exc:
            log.info("not recovering %s: %s", e.id, exc)

    # finishing -----------------------------------------------------------------------------

    def _complete(self, e: Episode, exit_code: int | None) -> None:
        try:
            state, reason, reward = self._finish(e, exit_code)
        except TemporaryError as exc:
            log.warning("finishing %s must wait: %s", e.id, exc)
            return
        except PermanentError as exc:
            state, reason, reward = S.FAILED, str(exc), None
        self._transition_or_cleanup(e, state, reason, expect=(S.RUNNING,), exit_code=exit_code, reward=reward)
        self._delete_quietly(e.node, e.sandbox_id)

    def _fail_run(self, e: Episode, reason: str) -> None:
        self._transition_or_cleanup(e, S.FAILED, reason, expect=(S.RUNNING,))
        self._delete_quietly(e.node, e.sandbox_id)

    # user requests -------------------------------------------------------------------------

    def cancel(self, episode_id: str) -> Episode:
        e = self.store.get(episode_id)
        if e.state in TERMINAL:
            raise FailedPrecondition(f"episode {episode_id} already ended as {e.state}")
        e = self.store.transition(episode_id, S.CANCELLED, "cancelled by user")
        if e.node and e.sandbox_id:
            self._workers.submit(self._delete_quietly, e.node, e.sandbox_id)
        self.wake()
        return e

    def resume(self, episode_id: str, node: str = "") -> Episode:
        e = self.store.get(episode_id)
        if e.state != S.PREEMPTED:
            raise FailedPrecondition(
                f"episode {episode_id} is {e.state}; only PREEMPTED episodes can be resumed"
            )
        if node:
            target = self.store.node(node)
            if target.state != NodeState.READY:
                raise FailedPrecondition(f"node {node} is {target.state}; resume on a READY node")
        e = self.store.update(
            episode_id, held=False, pinned_node=node, not_before=0.0, attempts=0,
            decision=f"resume requested{f' on node {node}' if node else ''}",
        )  # fmt: skip
        self.wake()
        return e

    def drain(self, name: str) -> NodeRecord:
        node = self.store.set_node_state(name, NodeState.DRAINING, "drain requested")
        self.wake()
        return node

    def uncordon(self, name: str) -> NodeRecord:
        node = self.store.set_node_state(name, NodeState.READY, "uncordoned")
        self.wake()
        return node

    # snapshot retention --------------------------------------------------------------------

    def collect_snapshots(self) -> None:
        """Keep the last N snapshots of live episodes; drop an ended episode's after a grace period."""
        now = time.time()
        ended = [
            e.id
            for e in self.store.query(states=TERMINAL)
            if e.finished_at and now - e.finished_at > self.settings.gc_grace_s
        ]
        try:
            report = self.snapshots.gc(
                RetentionPolicy(keep_last=self.settings.gc_keep_last), ended_episodes=ended
            )
            log.info("snapshot gc: %s", report)
        except SnapshotError as exc:
            log.warning("snapshot gc failed: %s", exc)


def _require_running(e: Episode) -> None:
    if e.state != S.RUNNING:
        raise FailedPrecondition(f"episode {e.id} is {e.state}; only RUNNING episodes can be checkpointed")
