"""The control loop: every tick it checks node liveness, observes each episode against what its
node reports, asks the scheduler what to do, and hands the work to operations.

`Control` also wires the loop's parts together; each part is a class of its own:
`Work` (operations in flight), `Membership` (nodes), `Operations` (start, restore, checkpoint,
finish), `Settlement` (intents left without an operation), `StalenessBound` (a GRPO group's
`max_staleness`), `Commands` (user requests), `Images`
(pinning and the image catalogue), `Logs` (harness output across runs) and
`collect_snapshots` (retention).
"""

from __future__ import annotations

import logging
import threading
import time

from orchestrator.control import scheduler
from orchestrator.control.commands import Commands
from orchestrator.control.forks import Forks
from orchestrator.control.images import Images
from orchestrator.control.logs import Logs
from orchestrator.control.membership import Membership
from orchestrator.control.node_agent import AgentPool, NodeAgents, SandboxState
from orchestrator.control.operations import (
    CursorHook,
    EnvHook,
    FinishHook,
    Operations,
    default_finish,
)
from orchestrator.control.outcomes import Outcomes
from orchestrator.control.retention import collect_snapshots
from orchestrator.control.settings import ControlSettings
from orchestrator.control.settle import Settlement
from orchestrator.control.staleness import StalenessBound
from orchestrator.control.work import Work
from orchestrator.domain import Episode, EpisodeState, FailedPrecondition, NodeRecord, NodeState, ids
from orchestrator.state import StateStore
from orchestrator.trajectory import Ledger
from snapshots import SnapshotStore

log = logging.getLogger(__name__)
S = EpisodeState

ON_NODE = (S.RUNNING, S.CHECKPOINTING, S.RESTORING, S.PENDING)
"""States in which an episode placed on a node depends on that node."""


class Control:
    def __init__(
        self,
        settings: ControlSettings,
        store: StateStore,
        snapshots: SnapshotStore,
        agents: NodeAgents | None = None,
        *,
        cursor: CursorHook | None = None,
        finish: FinishHook = default_finish,
        gateway_env: EnvHook | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.snapshots = snapshots
        self.agents: NodeAgents = agents or AgentPool()
        self.pool_of_addresses = ids.address_pool(settings.address_pool)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-loop", daemon=True)
        self._last_gc = time.time()
        self.work = Work(store, settings.workers, self.wake)
        self.members = Membership(settings, store, self.agents, self.work, self.wake)
        self.outcomes = Outcomes(settings, store, snapshots, self.members)
        self.operations = Operations(
            settings, store, snapshots, self.agents, self.work, self.members, self.outcomes,
            cursor=cursor or (lambda e: None), finish=finish, env=gateway_env or (lambda e: {}), ledger=ledger,
        )  # fmt: skip
        self.staleness = StalenessBound(store, ledger, self.members)
        self.settle = Settlement(store, self.agents, self.operations, self.outcomes)
        self.commands = Commands(store, self.work, self.members, self.operations, self.wake)
        self.forks = Forks(store, snapshots, self.operations, self.pool_of_addresses, self.wake)
        self.images = Images(store, self.agents)
        self.logs = Logs(store, self.agents)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Run the loop; on a standby that took over, every known node starts a fresh grace
        period, as after a restart."""
        self.members.begin(time.time())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.work.shutdown()
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

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.time()
        self.staleness.new_tick()
        for name in self.members.lost_nodes(now):
            for e in self.store.episodes.on_nodes(name):
                if e.state in ON_NODE and e.id not in self.work.busy():
                    self.outcomes.recover(e, f"node {name} was lost")
        nodes = {n.name: n for n in self.store.nodes.all()}
        # The queue is read apart, by the scheduler, as far as it can place or preempt: a tick's
        # work grows with the cluster, not with how many episodes wait.
        episodes = self.store.episodes.on_nodes()
        recovered = False
        for e in episodes:
            if e.id not in self.work.busy():
                recovered |= self._observe(e, nodes, now)
        if recovered:  # read again what the recoveries moved; what began meanwhile is busy
            episodes = self.store.episodes.on_nodes()
        queue = self.store.episodes.queue(now)
        for decision in scheduler.plan(episodes, nodes.values(), now, self.work.busy(), queue=queue):
            self._apply(decision)
        if now - self._last_gc >= self.settings.gc_interval_s:
            self._last_gc = now
            self.work.background(collect_snapshots, self.settings, self.store, self.snapshots)

    def _observe(self, e: Episode, nodes: dict[str, NodeRecord], now: float) -> bool:
        """Start whatever the episode's state and its node's report call for; True if that
        moved the episode at once (its node was lost), not in the background."""
        node = nodes.get(e.node)
        if e.node and (node is None or node.state == NodeState.LOST):
            if e.state in ON_NODE:
                self.outcomes.recover(e, f"node {e.node} was lost")
                return True
            return False
        self._begin_due_work(e, now)
        return False

    def _begin_due_work(self, e: Episode, now: float) -> None:
        """Begin in the background what the episode's state and its node's report call for."""
        if e.state == S.RUNNING:
            limit = e.spec.limits.max_wall_s
            if limit and e.total_run_s(now) > limit:
                why = f"ran {e.total_run_s(now):.0f}s, past limits.max_wall_s={limit:.0f}"
                self.work.begin(e, self.operations.fail_run, why)
                return
            if e.pending_snapshot_id:
                self.work.begin(e, self.settle.autosave)
                return
            reported_at, report = self.members.report(e.node)
            sandbox = report.get(e.sandbox_id)
            if sandbox is not None and sandbox.state == SandboxState.EXITED and not sandbox.busy:
                self.work.begin(e, self.operations.complete, sandbox.exit_code)
            elif stale := self.staleness.why(e):  # a harness that exited takes no next turn
                self.work.begin(e, self.staleness.rerun, stale)
            elif sandbox is None and reported_at > e.updated_at + 2 * self.settings.heartbeat_interval_s:
                self.work.begin(e, self.settle.missing)
        elif e.state == S.CHECKPOINTING:
            self.work.begin(e, self.settle.checkpoint)
        elif e.state == S.RESTORING or (e.state == S.PENDING and e.node):
            self.work.begin(e, self.settle.start)

    def _apply(self, decision: scheduler.Decision) -> None:
        e = decision.episode
        if isinstance(decision, scheduler.CheckpointDecision):
            try:
                self.operations.begin_checkpoint(
                    e.id, decision.reason, decision.why, leave_running=decision.leave_running
                )
            except FailedPrecondition as exc:  # it moved on since the tick read it
                log.info("not checkpointing %s: %s", e.id, exc)
        elif isinstance(decision, scheduler.RestoreDecision):
            self.operations.begin_restore(e, decision.node, decision.why)
        else:
            self.operations.begin_start(e, decision.node, decision.why)
