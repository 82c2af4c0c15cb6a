"""Episodes: their state machine, the record the control plane keeps, and the events it logs."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.domain.spec import EpisodeSpec


class EpisodeState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    PREEMPTED = "PREEMPTED"
    RESTORING = "RESTORING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({EpisodeState.SUCCEEDED, EpisodeState.FAILED, EpisodeState.CANCELLED})

# Every move the state machine allows. Anything live may fail or be cancelled.
ALLOWED: dict[EpisodeState, frozenset[EpisodeState]] = {
    EpisodeState.PENDING: frozenset({EpisodeState.RUNNING}),
    EpisodeState.RUNNING: frozenset(
        {EpisodeState.CHECKPOINTING, EpisodeState.SUCCEEDED, EpisodeState.PENDING, EpisodeState.PREEMPTED}
    ),
    EpisodeState.CHECKPOINTING: frozenset(
        {EpisodeState.PREEMPTED, EpisodeState.RUNNING, EpisodeState.PENDING}
    ),
    EpisodeState.PREEMPTED: frozenset({EpisodeState.RESTORING, EpisodeState.PENDING}),
    EpisodeState.RESTORING: frozenset({EpisodeState.RUNNING, EpisodeState.PREEMPTED, EpisodeState.PENDING}),
    EpisodeState.SUCCEEDED: frozenset(),
    EpisodeState.FAILED: frozenset(),
    EpisodeState.CANCELLED: frozenset(),
}
for _state in EpisodeState:
    if not _state.terminal:
        ALLOWED[_state] = ALLOWED[_state] | {EpisodeState.FAILED, EpisodeState.CANCELLED}


@dataclass
class Episode:
    id: str
    spec: EpisodeSpec
    state: EpisodeState
    reason: str
    submitted_at: float
    updated_at: float
    address: str
    token: str
    """Bearer token the episode's harness presents to the inference gateway."""
    node: str = ""
    sandbox_id: str = ""
    runs: int = 0
    """How many sandboxes this episode has had: each start or restore is a new run."""
    run_started_at: float = 0.0
    run_seconds: float = 0.0
    """Running time of finished runs; the current run adds now - run_started_at."""
    queued_at: float = 0.0
    """When the episode last began to wait; the oldest waiter resumes first."""
    held: bool = False
    """Preempted by hand: waits for ResumeEpisode instead of being rescheduled."""
    pinned_node: str = ""
    """The node a resume named; the restore goes there (again, if one is cut short), and the pin
    ends once it runs there or that node is lost (else the episode would wait for it forever)."""
    snapshots: int = 0
    last_snapshot_id: str = ""
    restored_from: str = ""
    """The snapshot the current run was restored from; empty for a fresh start."""
    pending_snapshot_id: str = ""
    """A snapshot asked of an agent and not yet known to be committed."""
    pending_reason: str = ""
    last_autosave_at: float = 0.0
    exit_code: int | None = None
    reward: float | None = None
    finished_at: float = 0.0
    not_before: float = 0.0
    """After a failed attempt, the scheduler leaves the episode alone until then."""
    attempts: int = 0
    """Consecutive failed start/restore attempts."""
    log_offsets: tuple[int, ...] = ()
    """Where each run's output begins in the harness log (index run - 1); -1 for a run whose
    output is gone (the episode started over after it)."""
    group_id: str = ""
    """The GRPO group this episode is a member of (`Group`); empty for none."""
    group_index: int = 0
    """Its place in the group, from 0; fixed at submit, kept across every re-run."""
    forked_from: str = ""
    """The snapshot this episode was forked from (another episode's, `Origin`); empty: none. Its
    first run restores that snapshot, never the image's command."""
    fork_parent: str = ""
    """The episode that took `forked_from`."""
    fork_index: int = 0
    """Its place among the children forked from that snapshot, from 0 (STASIS_FORK_INDEX)."""
    key_of: str = ""
    """The episode whose gateway key this one's harness holds: a fork child's memory is its
    parent's, the key in its environment too. Empty: its own key (`token`)."""

    def with_run_log(self, run: int, start: int, *, fresh: bool) -> tuple[int, ...]:
        """`log_offsets` once run `run` began at byte `start`; a fresh start begins a new log."""
        earlier = self.log_offsets[: run - 1]
        earlier = (*earlier, *(start,) * (run - 1 - len(earlier)))  # runs that never ran wrote nothing
        return (*((-1,) * len(earlier) if fresh else earlier), start)

    @property
    def snapshot_parent(self) -> str:
        """The parent the episode's next snapshot names: its resume point, but none for a fork
        child's first own snapshot (the store keeps a line within one episode)."""
        return "" if self.last_snapshot_id == self.forked_from else self.last_snapshot_id

    @property
    def restores_its_fork(self) -> bool:
        """A fork child whose resume point is still the snapshot it was forked from."""
        return bool(self.forked_from) and self.last_snapshot_id == self.forked_from

    def from_the_start(self) -> tuple[EpisodeState, dict[str, Any]]:
        """Where the episode goes to run again from its start, and what that resets: a fresh
        episode back to PENDING, to run its command; a fork child back to the snapshot it was
        forked from, PREEMPTED, to restore it again."""
        if self.forked_from:
            return EpisodeState.PREEMPTED, {"last_snapshot_id": self.forked_from, "restored_from": ""}
        return EpisodeState.PENDING, {"last_snapshot_id": "", "restored_from": ""}

    @property
    def priority(self) -> int:
        return self.spec.preemption.priority

    def has_labels(self, labels: Mapping[str, str]) -> bool:
        """Whether the spec carries every one of `labels`."""
        return all(self.spec.labels.get(k) == v for k, v in labels.items())

    @property
    def queued(self) -> bool:
        """Waiting for a slot: preempted, or submitted and not placed on a node yet (the state
        store's `QUEUED_SQL` says the same of those not held)."""
        return self.state == EpisodeState.PREEMPTED or (self.state == EpisodeState.PENDING and not self.node)

    def current_run_s(self, now: float) -> float:
        return (
            now - self.run_started_at if self.state == EpisodeState.RUNNING and self.run_started_at else 0.0
        )

    def total_run_s(self, now: float) -> float:
        return self.run_seconds + self.current_run_s(now)

    def unsaved_s(self, now: float) -> float:
        """How long it has run since its last snapshot: the work a lost node would take with it."""
        if self.state != EpisodeState.RUNNING or not self.run_started_at:
            return 0.0
        return now - max(self.run_started_at, self.last_autosave_at)


@dataclass(frozen=True)
class Origin:
    """Where a fork child starts: a committed snapshot of another episode, restored."""

    snapshot_id: str
    parent: Episode
    """The episode that took the snapshot."""
    index: int
    """The child's place among the snapshot's children, from 0."""

    @property
    def key_of(self) -> str:
        """The episode whose key the restored harness holds: the first of the fork's line."""
        return self.parent.key_of or self.parent.id


@dataclass(frozen=True)
class Event:
    seq: int
    episode_id: str
    kind: str
    """transition | decision | node"""
    from_state: str
    to_state: str
    reason: str
    message: str
    node: str
    at: float
    actor: str = ""
    """Who asked for this change: a caller's name and role; empty for the control loop's own work."""
