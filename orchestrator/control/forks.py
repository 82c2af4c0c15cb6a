"""Forks: N new episodes from one snapshot of an episode, each a full episode of its own.

The source is one of the episode's committed snapshots (named, or its latest), or one taken now
of the running episode, which then runs on or stops at it. A fork asked while a checkpoint of
the episode is under way forks that checkpoint's snapshot: two concurrent forks make one.

A child is committed PREEMPTED with the source as its resume point (`Origin`), so the scheduler
restores it wherever a node can take it, as it would resume a preempted episode; from then on it
is an episode like any other. While it may still restore the source, retention keeps that
snapshot (its resume point anchors it, `retention`), even after the parent ended.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from orchestrator.control.operations import Operations
from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    Group,
    InvalidArgument,
    NotFound,
    Origin,
    Reason,
    SnapshotRecord,
)
from orchestrator.state import StateStore
from orchestrator.state.records import MAX_REQUEST_ID
from snapshots import SnapshotStore

MAX_CHILDREN = 1000
FORK_INDEX_ENV = "STASIS_FORK_INDEX"
"""Set in each child's spec: the child's place among the fork's children, from 0."""


class Forks:
    def __init__(
        self,
        store: StateStore,
        snapshots: SnapshotStore,
        operations: Operations,
        addresses: ipaddress.IPv4Network,
        wake: Callable[[], None],
        checkpoint_timeout_s: float = 600.0,
    ) -> None:
        self.store = store
        self.snapshots = snapshots
        self.operations = operations
        self.addresses = addresses
        self._wake = wake
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self._taking = threading.Lock()
        """Held from reading an episode's pending snapshot to asking for one."""

    def fork(
        self,
        episode_id: str,
        count: int,
        *,
        snapshot_id: str = "",
        now: bool = False,
        stop: bool = False,
        labels: Mapping[str, str] | None = None,
        group: Group | None = None,
        request_id: str = "",
    ) -> tuple[SnapshotRecord, list[Episode]]:
        """The snapshot forked and the children, in fork index order. Everything is checked
        before anything is done; a retry with the same request id returns the first call's
        children, and takes no second snapshot."""
        if not 1 <= count <= MAX_CHILDREN:
            raise InvalidArgument("count", f"is {count}; a fork makes 1 to {MAX_CHILDREN} children")
        if stop and not now:
            raise InvalidArgument("stop", "needs now: only a snapshot taken now can stop the episode")
        if now and snapshot_id:
            raise InvalidArgument("snapshot_id", "is given with now; fork a named snapshot or one taken now")
        if group is not None and group.size != count:
            raise InvalidArgument("group.size", f"is {group.size}, but the fork makes {count} children")
        if len(request_id) + 1 + len(str(count - 1)) > MAX_REQUEST_ID:
            raise InvalidArgument(
                "request_id", f"has {len(request_id)} characters; child i of the fork carries it as"
                f" <request_id>/<i>, of at most {MAX_REQUEST_ID}"
            )  # fmt: skip
        asked = {
            "episode_id": episode_id, "count": count, "snapshot_id": snapshot_id, "now": now, "stop": stop,
            "labels": dict(labels or {}), "group": group.id if group else "",
        }  # fmt: skip
        if request_id and (known := self.store.requests.known(request_id, "ForkEpisode", asked)):
            children = [self.store.episodes.get(child) for child in known.split(",")]
            source = self.store.snapshots.get(children[0].forked_from)
            assert source is not None, (
                f"the fork {request_id} forked {children[0].forked_from}, now unrecorded"
            )
            return source, children
        parent = self.store.episodes.get(episode_id)
        specs = [
            (child_spec(parent.spec, labels or {}, index), f"{request_id}/{index}" if request_id else "")
            for index in range(count)
        ]
        if now:
            source = self._taken_now(parent, stop)
        else:
            source = self._named(parent, snapshot_id or parent.last_snapshot_id, "snapshot_id")
        children = self.start_from(source, parent, specs, group)
        if request_id:
            self.store.requests.remember(request_id, "ForkEpisode", asked, ",".join(c.id for c in children))
        return source, children

    def start_from(
        self,
        source: SnapshotRecord,
        parent: Episode,
        specs: Sequence[tuple[EpisodeSpec, str]],
        group: Group | None = None,
    ) -> list[Episode]:
        """Commit children that restore `source` (taken by `parent`), one per spec and request id."""
        self.check_restorable(source, "snapshot_id")
        origins = [Origin(source.id, parent, index) for index in range(len(specs))]
        children = self.store.episodes.submit_many(specs, self.addresses, group, origins)
        self._wake()
        return children

    def source(self, snapshot_id: str, field: str) -> tuple[SnapshotRecord, Episode]:
        """A committed snapshot a submit may start from, and the episode that took it."""
        record = self.store.snapshots.get(snapshot_id)
        if record is None:
            raise NotFound(f"{field}: no snapshot {snapshot_id!r} is recorded")
        return record, self.store.episodes.get(record.episode_id)

    def _named(self, parent: Episode, snapshot_id: str, field: str) -> SnapshotRecord:
        if not snapshot_id:
            raise FailedPrecondition(
                f"episode {parent.id} has no snapshot to fork; fork it now (now=true) while it runs"
            )
        record = self.store.snapshots.get(snapshot_id)
        if record is None or record.episode_id != parent.id:
            raise NotFound(f"{field}: episode {parent.id} has no snapshot {snapshot_id!r}")
        return record

    def check_restorable(self, record: SnapshotRecord, field: str) -> None:
        """FailedPrecondition, naming `field`, unless a child could restore the snapshot now."""
        if not record.manifest_digest:
            raise FailedPrecondition(
                f"{field}: snapshot {record.id} was recorded without its manifest's digest; it is never restored"
            )
        if not self.snapshots.exists(record.id):
            raise FailedPrecondition(
                f"{field}: snapshot {record.id} is no longer in the store (retention collected it)"
            )

    def _taken_now(self, parent: Episode, stop: bool) -> SnapshotRecord:
        """Checkpoint the episode and wait for the snapshot; a checkpoint already under way that
        leaves it running is joined instead, unless this fork stops the episode."""
        with self._taking:
            e = self.store.episodes.get(parent.id)
            if e.pending_snapshot_id and e.state == EpisodeState.RUNNING and not stop:
                pending = e.pending_snapshot_id
            else:
                why = "fork" + ("; the episode stops at the snapshot" if stop else "")
                e = self.operations.begin_checkpoint(e.id, Reason.FORK, why, leave_running=not stop)
                pending = e.pending_snapshot_id
        return self._committed(parent.id, pending)

    def _committed(self, episode_id: str, snapshot_id: str) -> SnapshotRecord:
        deadline = time.monotonic() + self.checkpoint_timeout_s
        pause = 0.01
        while (record := self.store.snapshots.get(snapshot_id)) is None:
            e = self.store.episodes.get(episode_id)
            if e.pending_snapshot_id != snapshot_id:
                if (record := self.store.snapshots.get(snapshot_id)) is not None:
                    break
                raise FailedPrecondition(
                    f"the snapshot {snapshot_id} to fork {episode_id} was not taken: {e.reason}"
                )
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"the snapshot {snapshot_id} to fork {episode_id} took over {self.checkpoint_timeout_s:.0f} s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        return record


def child_spec(spec: EpisodeSpec, labels: Mapping[str, str], index: int) -> EpisodeSpec:
    """A child's spec: its parent's, with `labels` added and its fork index in its environment;
    a bad label is refused naming it (`labels.<key>`)."""
    child = replace(spec, labels={**spec.labels, **labels}, env={**spec.env, FORK_INDEX_ENV: str(index)})
    try:
        return child.validate()
    except InvalidArgument as exc:
        raise InvalidArgument(exc.field.removeprefix("spec."), exc.problem) from None
