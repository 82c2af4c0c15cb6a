"""What users ask of the control plane directly: preempt, cancel, resume, drain and uncordon.

Each checks the request against the current state, commits it, and wakes the loop; the work
itself (checkpoint, restore, moving episodes off a node) is done by operations.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.control.membership import Membership
from orchestrator.control.operations import Operations
from orchestrator.control.work import Work
from orchestrator.domain import (
    TERMINAL,
    Episode,
    EpisodeState,
    FailedPrecondition,
    NodeRecord,
    NodeState,
    Reason,
)
from orchestrator.state import StateStore


class Commands:
    def __init__(
        self,
        store: StateStore,
        work: Work,
        members: Membership,
        operations: Operations,
        wake: Callable[[], None],
    ) -> None:
        self.store = store
        self.work = work
        self.members = members
        self.operations = operations
        self._wake = wake

    def preempt(self, episode_id: str, why: str) -> Episode:
        """Checkpoint a running episode and hold it until it is resumed."""
        return self.operations.begin_checkpoint(episode_id, Reason.MANUAL, why)

    def cancel(self, episode_id: str) -> Episode:
        e = self.store.episodes.get(episode_id)
        if e.state in TERMINAL:
            raise FailedPrecondition(f"episode {episode_id} already ended as {e.state}")
        e = self.store.episodes.transition(episode_id, EpisodeState.CANCELLED, "cancelled by user")
        if e.node and e.sandbox_id:
            self.work.background(self.members.delete_quietly, e.node, e.sandbox_id)
        self._wake()
        return e

    def resume(self, episode_id: str, node: str = "") -> Episode:
        e = self.store.episodes.get(episode_id)
        if e.state != EpisodeState.PREEMPTED:
            raise FailedPrecondition(
                f"episode {episode_id} is {e.state}; only PREEMPTED episodes can be resumed"
            )
        if node:
            target = self.store.nodes.get(node)
            if target.state != NodeState.READY:
                raise FailedPrecondition(f"node {node} is {target.state}; resume on a READY node")
        e = self.store.episodes.update(
            episode_id, held=False, pinned_node=node, not_before=0.0, attempts=0,
            decision=f"resume requested{f' on node {node}' if node else ''}",
            expect=(EpisodeState.PREEMPTED,),  # a cancel or restore since the check above wins
        )  # fmt: skip
        self._wake()
        return e

    def drain(self, name: str, reason: str = "drain requested") -> NodeRecord:
        node = self.store.nodes.set_state(name, NodeState.DRAINING, reason)
        self._wake()
        return node

    def uncordon(self, name: str) -> NodeRecord:
        node = self.store.nodes.set_state(name, NodeState.READY, "uncordoned")
        self._wake()
        return node
