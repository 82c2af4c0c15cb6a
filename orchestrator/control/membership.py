"""Node membership: registration, heartbeats and what they report, liveness, and fencing.

A node silent for `node_lost_after_s` is LOST. When it reports again, every sandbox it holds that
the control plane no longer expects there is deleted (fencing), so no episode ever runs twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator.control.node_agent import NodeAgents, SandboxView
from orchestrator.control.settings import ControlSettings
from orchestrator.control.work import Work
from orchestrator.domain import NodeRecord, NodeState, NotFound, StasisError
from orchestrator.domain.ids import SandboxId
from orchestrator.state import StateStore

log = logging.getLogger(__name__)


class Membership:
    def __init__(
        self,
        settings: ControlSettings,
        store: StateStore,
        agents: NodeAgents,
        work: Work,
        wake: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.agents = agents
        self.work = work
        self._wake = wake
        self._lock = threading.Lock()
        self._heartbeats: dict[str, float] = {}
        self._reports: dict[str, tuple[float, dict[str, SandboxView]]] = {}
        self.begin(time.time())

    def begin(self, now: float) -> None:
        """Start (or take over) membership: every known node gets a full grace period before it
        can be declared lost, and what it reported to anyone else is forgotten."""
        with self._lock:
            self._reports.clear()
            for n in self.store.nodes.all():
                self._heartbeats[n.name] = now
                self.agents.set(n.name, n.address)

    def registered(self, node: NodeRecord, sandboxes: list[SandboxView]) -> NodeRecord:
        node.last_heartbeat = time.time()
        saved = self.store.nodes.upsert(node)
        if saved.state == NodeState.LOST:
            saved = self.store.nodes.set_state(node.name, NodeState.READY, "node is back")
        self.agents.set(node.name, node.address)
        self.heartbeat(node.name, sandboxes, node.images)
        return saved

    def heartbeat(self, name: str, sandboxes: list[SandboxView], images: dict[str, list[str]]) -> bool:
        """Note a node's report; False if the node is unknown and must register again."""
        try:
            node = self.store.nodes.get(name)
        except NotFound:
            return False
        now = time.time()
        with self._lock:
            self._heartbeats[name] = now
            self._reports[name] = (now, {s.id: s for s in sandboxes})
        if node.state == NodeState.LOST:
            self.store.nodes.set_state(name, NodeState.READY, "heartbeats resumed")
        if images != node.images:
            self.store.nodes.set_images(name, images)
        self._fence(name, sandboxes)
        self._wake()
        return True

    def last_heartbeat(self, name: str) -> float:
        with self._lock:
            return self._heartbeats.get(name, 0.0)

    def report(self, node: str) -> tuple[float, dict[str, SandboxView]]:
        """When the node last reported, and the sandboxes it reported then."""
        with self._lock:
            return self._reports.get(node, (0.0, {}))

    def lost_nodes(self, now: float) -> list[str]:
        """Declare LOST every node silent for too long; returns the ones newly lost."""
        lost = []
        for node in self.store.nodes.all():
            if node.state == NodeState.LOST:
                continue
            with self._lock:
                last = self._heartbeats.setdefault(node.name, now)
            if now - last > self.settings.node_lost_after_s:
                self.store.nodes.set_state(node.name, NodeState.LOST, f"no heartbeat for {now - last:.0f}s")
                lost.append(node.name)
        return lost

    def _fence(self, node: str, sandboxes: list[SandboxView]) -> None:
        """Delete sandboxes of episodes that moved on (e.g. after this node was lost)."""
        busy = self.work.busy()
        expected = {e.sandbox_id for e in self.store.episodes.on_nodes(node)}
        for s in sandboxes:
            name = SandboxId.parse(s.id)
            if name is None or s.id in expected or name.episode_id in busy or s.busy:
                continue
            log.warning("node %s still holds stale sandbox %s; deleting it", node, s.id)
            self.work.background(self.delete_quietly, node, s.id)

    def delete_quietly(self, node: str, sandbox_id: str) -> None:
        try:
            self.agents.get(node).delete(sandbox_id)
        except StasisError as exc:
            log.warning("could not delete sandbox %s on node %s: %s", sandbox_id, node, exc)
