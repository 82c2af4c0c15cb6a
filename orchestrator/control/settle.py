"""Settling: an episode found in an intent state with no operation behind it (the orchestrator
restarted, or an agent's reply was lost) is resolved from the truth on its node and in the
snapshot store, never by guessing."""

from __future__ import annotations

from orchestrator.control.node_agent import NodeAgents, SandboxState
from orchestrator.control.operations import Operations
from orchestrator.control.outcomes import Outcomes
from orchestrator.domain import Episode, EpisodeState, TemporaryError
from orchestrator.state import StateStore

S = EpisodeState


class Settlement:
    def __init__(
        self, store: StateStore, agents: NodeAgents, operations: Operations, outcomes: Outcomes
    ) -> None:
        self.store = store
        self.agents = agents
        self.operations = operations
        self.outcomes = outcomes

    def checkpoint(self, e: Episode) -> None:
        """CHECKPOINTING: record the snapshot if it was committed, else find out why not."""
        if self.outcomes.record_if_committed(e, leave_running=False):
            return
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return  # ask again next tick; a lost node is handled by liveness
        if sandbox is None:
            self.outcomes.recover(e, f"sandbox {e.sandbox_id} vanished during a checkpoint")
        elif sandbox.busy or sandbox.state == SandboxState.PAUSED:
            return  # the agent is still at it
        else:
            # The intent was committed but the checkpoint never ran (the request died with the
            # orchestrator): carry it out now rather than drop what was asked for.
            self.operations.checkpoint(e, leave_running=False)

    def autosave(self, e: Episode) -> None:
        """A RUNNING episode with a pending autosave no worker is taking: record it if its
        snapshot is in the store; wait while the agent is still at it (its snapshot is recorded
        when it lands, not orphaned as a newer one the record does not know); else it failed."""
        if self.outcomes.record_if_committed(e, leave_running=True):
            return
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return  # ask again next tick; a lost node is handled by liveness
        if sandbox is not None and sandbox.busy:
            return
        self.outcomes.autosave_failed(e, "it did not complete")

    def start(self, e: Episode) -> None:
        """RESTORING, or PENDING with a node: did the sandbox come up?"""
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return
        if sandbox is not None and sandbox.busy:
            return
        if sandbox is not None:
            verb = "restored" if e.state == S.RESTORING else "started"
            self.outcomes.running(e, e.state, f"{verb} on {e.node}")
        elif e.state == S.RESTORING:
            self.outcomes.restore_failed(e, f"restore on {e.node} did not complete", final=False)
        else:
            self.store.episodes.update(
                e.id, node="", sandbox_id="", decision=f"start on {e.node} did not complete"
            )

    def missing(self, e: Episode) -> None:
        """A RUNNING episode whose node stopped reporting its sandbox."""
        try:
            sandbox = self.agents.get(e.node).get(e.sandbox_id)
        except TemporaryError:
            return
        if sandbox is None:
            self.outcomes.recover(e, f"sandbox {e.sandbox_id} disappeared from node {e.node}")
