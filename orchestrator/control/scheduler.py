"""Placement and preemption policies as one pure function: a view of the cluster in, decisions out.

Decisions, in order of precedence:
1. drain: every running episode on a draining node is checkpointed;
2. placement: waiting episodes (highest priority first, then the one waiting longest) go to a
   fitting node that caches their image (or, for a registry image, any fitting node, which pulls
   it; one that caches it first), with the most free slots, then memory;
3. priority: a waiting episode that fits nowhere preempts the lowest-priority, longest-running
   episode whose node would then fit it;
4. time slice: while episodes still wait, runs past their slice are checkpointed and requeued,
   longest first, one per waiting episode that the freed slot would fit;
5. autosave: runs past their autosave period get a leave-running snapshot.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

from orchestrator.domain import Episode, EpisodeState, NodeRecord, NodeState, Reason, is_reference


@dataclass(frozen=True)
class StartDecision:
    """Start a waiting episode that has never run on `node`."""

    episode: Episode
    node: str
    why: str


@dataclass(frozen=True)
class RestoreDecision:
    """Resume a preempted episode on `node` from its last snapshot."""

    episode: Episode
    node: str
    why: str


@dataclass(frozen=True)
class CheckpointDecision:
    """Snapshot a running episode and take it off its node; with `leave_running`, an autosave
    that leaves it running."""

    episode: Episode
    reason: Reason
    why: str
    leave_running: bool = False


Decision = StartDecision | RestoreDecision | CheckpointDecision


def staging_mb(e: Episode) -> int:
    """What a checkpoint of the episode stages on its node's disk: its layer's tar and memory."""
    return e.spec.resources.disk_mb + e.spec.resources.memory_mb


@dataclass
class _Room:
    """What a node has left. Its disk holds every layer whole, and room beside them to stage the
    largest checkpoint among its episodes, as its agent counts (`sandbox_agent/node/disk.py`)."""

    node: NodeRecord
    slots: int
    memory_mb: int
    episodes: list[Episode] = field(default_factory=list)
    layers_mb: int = 0
    staging_mb: int = 0

    def fits(self, e: Episode, freed: Episode | None = None) -> bool:
        """Whether `e` fits, once `freed` (an episode of the node's) is gone."""
        r, gone = e.spec.resources, freed.spec.resources if freed else None
        return (
            self.slots + (freed is not None) >= 1
            and self.memory_mb + (gone.memory_mb if gone else 0) >= r.memory_mb
            and (
                not self.node.disk_mb
                or self.layers_mb
                - (gone.disk_mb if gone else 0)
                + r.disk_mb
                + max(self.staging_mb, staging_mb(e))
                <= self.node.disk_mb
            )
        )

    def take(self, e: Episode) -> None:
        self.slots -= 1
        self.memory_mb -= e.spec.resources.memory_mb
        self.layers_mb += e.spec.resources.disk_mb
        self.staging_mb = max(self.staging_mb, staging_mb(e))


def occupies_node(e: Episode) -> bool:
    """Whether the episode holds (or is about to hold) a slot on e.node."""
    return bool(e.node) and e.state in (
        EpisodeState.PENDING,
        EpisodeState.RUNNING,
        EpisodeState.CHECKPOINTING,
        EpisodeState.RESTORING,
    )


def usable_for(e: Episode, node: NodeRecord) -> bool:
    """A node may take the episode if it caches the image or can pull it from a registry, and,
    for a fork child restoring its fork, if it restores a snapshot as another sandbox."""
    image = e.spec.image
    return (
        (not e.pinned_node or e.pinned_node == node.name)
        and (node.has_image(image) or is_reference(image))
        and (node.restores_forks or not e.restores_its_fork)
    )


def order(e: Episode) -> tuple[int, float, str]:
    """Who among the waiting comes first: the highest priority, then the longest waiting."""
    return (-e.priority, e.queued_at, e.id)


def _while(holds: Callable[[], bool], items: Iterator[Episode]) -> Iterator[Episode]:
    """`items` as long as `holds()` before each is read; the rest stays unread."""
    while holds() and (item := next(items, None)) is not None:
        yield item


def plan(
    episodes: Iterable[Episode],
    nodes: Iterable[NodeRecord],
    now: float,
    busy: Collection[str] = (),
    queue: Iterable[Episode] = (),
) -> list[Decision]:
    """Decide what to start, restore and checkpoint now. `busy` episodes have an operation in
    flight. `queue` holds more waiting episodes, in `order` (`Episodes.queue`); it is read only
    as far as a decision can still come of it: placements while a node has a free slot, then
    preemptions while a running episode has a lower priority than the next in line, then time
    slices while a sliced run is left."""
    episodes = list(episodes)
    rooms = {
        n.name: _Room(n, n.slots, n.memory_mb)
        for n in nodes
        if n.state in (NodeState.READY, NodeState.DRAINING)
    }
    for e in episodes:
        if occupies_node(e) and e.node in rooms:
            rooms[e.node].take(e)
            rooms[e.node].episodes.append(e)
    running = [e for e in episodes if e.state == EpisodeState.RUNNING and e.id not in busy]
    decisions: list[Decision] = []
    chosen: set[str] = set()

    # A draining node may be gone before every episode on it is saved (a spot node's notice gives
    # seconds): the ones with the most work since their last snapshot go first; any left when
    # the node is lost resume from their last autosave.
    draining = [e for e in running if (r := rooms.get(e.node)) and r.node.state == NodeState.DRAINING]
    for e in sorted(draining, key=lambda e: (-e.unsaved_s(now), e.id)):
        unsaved = e.unsaved_s(now)
        decisions.append(
            CheckpointDecision(e, Reason.DRAIN, f"node {e.node} is draining ({unsaved:.0f}s unsaved)")
        )
        chosen.add(e.id)

    ready = [r for r in rooms.values() if r.node.state == NodeState.READY]
    known = {e.id for e in episodes}  # `queue` was read apart from them: one may be in both
    waiting = (
        e
        for e in heapq.merge(sorted(episodes, key=order), (e for e in queue if e.id not in known), key=order)
        if e.queued and e.id not in busy and not e.held and e.not_before <= now
    )
    unplaced: list[Episode] = []
    # Once no node has a free slot, nobody further back can be placed.
    for e in _while(lambda: any(r.slots >= 1 for r in ready), waiting):
        fitting = [r for r in ready if r.fits(e) and usable_for(e, r.node)]
        if not fitting:
            unplaced.append(e)
            continue
        best = min(
            fitting, key=lambda r: (not r.node.has_image(e.spec.image), -r.slots, -r.memory_mb, r.node.name)
        )
        best.take(e)
        waited = now - e.queued_at
        if e.state == EpisodeState.PREEMPTED:
            decisions.append(
                RestoreDecision(e, best.node.name, f"resumed on {best.node.name} after waiting {waited:.0f}s")
            )
        else:
            decisions.append(
                StartDecision(e, best.node.name, f"placed on {best.node.name} ({best.slots} slots left)")
            )

    def freed_room_fits(waiter: Episode, victim: Episode) -> bool:
        room = rooms.get(victim.node)
        if room is None or room.node.state != NodeState.READY or not usable_for(waiter, room.node):
            return False
        # The victim's slot frees; its memory and disk must make room for the waiter too.
        return room.fits(waiter, freed=victim)

    in_line = itertools.chain(unplaced, waiting)
    still_waiting: list[Episode] = []
    for e in in_line:
        victims = [
            v for v in running if v.id not in chosen and v.priority < e.priority and freed_room_fits(e, v)
        ]
        if victims:
            victim = min(victims, key=lambda v: (v.priority, -v.current_run_s(now), v.id))
            chosen.add(victim.id)
            decisions.append(
                CheckpointDecision(
                    victim,
                    Reason.PRIORITY,
                    f"episode {e.id} (priority {e.priority}) needs the slot of priority {victim.priority}",
                )
            )
        else:
            still_waiting.append(e)
        # Nobody further back, of no higher priority, can preempt a run that this one cannot.
        if not any(v.id not in chosen and v.priority < e.priority for v in running):
            break

    sliced = sorted(
        (
            v
            for v in running
            if v.id not in chosen
            and v.spec.preemption.time_slice_s > 0
            and v.current_run_s(now) >= v.spec.preemption.time_slice_s
        ),
        key=lambda v: -v.current_run_s(now),
    )
    in_line = itertools.chain(still_waiting, in_line)
    for e in _while(lambda: any(v.id not in chosen for v in sliced), in_line):
        sliced_victim = next((v for v in sliced if v.id not in chosen and freed_room_fits(e, v)), None)
        if sliced_victim is None:
            continue
        chosen.add(sliced_victim.id)
        run_s, slice_s = sliced_victim.current_run_s(now), sliced_victim.spec.preemption.time_slice_s
        decisions.append(
            CheckpointDecision(
                sliced_victim,
                Reason.TIME_SLICE,
                f"ran {run_s:.0f}s past its {slice_s:.0f}s slice while {e.id} waits",
            )
        )

    for e in running:
        period = e.spec.preemption.autosave_s
        if e.id in chosen or period <= 0 or e.not_before > now:
            continue
        if now - max(e.last_autosave_at, e.run_started_at) >= period:
            decisions.append(
                CheckpointDecision(e, Reason.AUTOSAVE, f"autosave every {period:.0f}s", leave_running=True)
            )
    return decisions
