"""A GRPO group's `max_staleness`, held by the control loop (docs/trajectory.md, "Policy
versions"): a running member whose next turn, sampled under the published version, would hold
tokens more than `max_staleness` versions older runs again from the start under that version.

The gateway refuses such a turn before it is sampled (`Answers._within_bound` in
`gateway/answering.py`), so none is ever sampled past the bound; this part ends the wait: it stops
the member's sandbox, abandons every turn the member recorded (`Ledger.start_over`), so the new
run's requests are sampled afresh rather than replayed, and queues it for a fresh start. A snapshot
would bring back a harness whose context holds the stale tokens, so none is restored. No reward is
given for the run cut short.
"""

from __future__ import annotations

import logging
import time

from orchestrator.control.membership import Membership
from orchestrator.domain import Episode, EpisodeState, FailedPrecondition
from orchestrator.state import StateStore
from orchestrator.trajectory import Ledger
from orchestrator.trajectory.policy import beyond_bound, stale_member

log = logging.getLogger(__name__)
S = EpisodeState


class StalenessBound:
    """Tells a member that went past its group's bound, and runs it again from the start."""

    def __init__(self, store: StateStore, ledger: Ledger | None, members: Membership) -> None:
        self.store = store
        self.ledger = ledger
        """Where turns and published versions are read; None: no bound is held (no gateway)."""
        self.members = members
        self._published: int | None = None
        self._bounds: dict[str, int | None] = {}

    def new_tick(self) -> None:
        """Forget what the last tick read: the published version and the groups' bounds are read
        once per tick, however many members are bounded."""
        self._published = None
        self._bounds.clear()

    def why(self, e: Episode) -> str:
        """Why the running member `e` may take no further turn ("stale-bounded: ..."); "" if it
        may, or is in no group with a bound."""
        if self.ledger is None or not e.group_id:
            return ""
        if e.group_id not in self._bounds:
            self._bounds[e.group_id] = self.store.groups.get(e.group_id).max_staleness
        bound = self._bounds[e.group_id]
        if bound is None:
            return ""
        if self._published is None:
            self._published = self.ledger.policy.published()
        published = self._published
        lag = beyond_bound(self.ledger.live_versions(e.id), published, bound) if published else None
        return "" if lag is None else stale_member(lag, published, bound)

    def rerun(self, e: Episode, why: str) -> None:
        """Send the member back to the start (an operation, on a worker). The transition comes
        first: from then on the old sandbox is no live run, and the gateway hears it no more."""
        assert self.ledger is not None
        to, reset = e.from_the_start()
        try:
            self.store.episodes.transition(
                e.id, to, f"{why}; group {e.group_id}'s member {e.group_index} runs again from the start "
                "under the published version", expect=(S.RUNNING,), node="", sandbox_id="", pending_snapshot_id="",
                pending_reason="", attempts=0, not_before=0.0, queued_at=time.time(), pinned_node="", **reset,
            )  # fmt: skip
        except FailedPrecondition as exc:  # it moved on since the tick read it
            log.info("not running %s again: %s", e.id, exc)
            return
        abandoned = self.ledger.start_over(e.id)
        log.info("episode %s is %s; %d recorded turns abandoned, starting over", e.id, why, abandoned)
        self.members.delete_quietly(e.node, e.sandbox_id)
