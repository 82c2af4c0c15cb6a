"""The scheduler's policies as a pure function: a cluster view in, decisions out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.control import scheduler
from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    NodeRecord,
    NodeState,
    Preemption,
    Reason,
    Resources,
)

NOW = 10_000.0


def node(
    name: str,
    slots: int = 1,
    memory_mb: int = 4096,
    state: NodeState = NodeState.READY,
    images: tuple[str, ...] = ("base",),
    disk_mb: int = 0,
    restores_forks: bool = True,
) -> NodeRecord:
    return NodeRecord(
        name=name, address="", state=state, backend="runc", slots=slots, memory_mb=memory_mb,
        images={f"sha256:{i}": [i] for i in images}, labels={}, registered_at=0, disk_mb=disk_mb,
        restores_forks=restores_forks,
    )  # fmt: skip


def episode(
    eid: str,
    state: EpisodeState = EpisodeState.PENDING,
    node_name: str = "",
    priority: int = 0,
    slice_s: float = 0,
    ran_s: float = 0,
    queued_at: float = 0,
    image: str = "base",
    memory_mb: int = 1024,
    disk_mb: int = 10240,
    **kw: object,
) -> Episode:
    spec = EpisodeSpec(
        image=image,
        command=("true",),
        resources=Resources(memory_mb=memory_mb, disk_mb=disk_mb),
        preemption=Preemption(priority=priority, time_slice_s=slice_s),
    )
    return Episode(
        id=eid, spec=spec, state=state, reason="", submitted_at=queued_at, updated_at=0, address="", token=eid,
        node=node_name, run_started_at=NOW - ran_s if state == EpisodeState.RUNNING else 0, queued_at=queued_at,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_placement_fills_the_freest_node_that_has_the_image() -> None:
    nodes = [node("a", slots=2), node("b", slots=3), node("c", slots=5, images=())]
    decisions = scheduler.plan([episode("e1"), episode("e2")], nodes, NOW)
    assert [(type(d).__name__, d.episode.id, getattr(d, "node", "")) for d in decisions] == [
        ("StartDecision", "e1", "b"),
        ("StartDecision", "e2", "a"),
    ]


def test_a_registry_image_goes_where_it_is_cached_else_anywhere_it_fits() -> None:
    ref = "127.0.0.1:5000/team/harness@sha256:" + "a" * 64
    cached = [node("a", slots=2), node("b", slots=5), node("c", slots=1, images=(ref,))]
    (first,) = scheduler.plan([episode("e1", image=ref)], cached, NOW)
    assert isinstance(first, scheduler.StartDecision) and first.node == "c", (
        "the node that caches it, though fuller"
    )
    (second,) = scheduler.plan([episode("e2", image=ref)], cached[:2], NOW)
    assert isinstance(second, scheduler.StartDecision) and second.node == "b", (
        "no node caches it: the freest pulls it"
    )
    assert scheduler.plan([episode("e3", image="unpullable-name")], cached, NOW) == []


def test_a_fork_child_restores_its_fork_only_on_a_node_that_restores_forks() -> None:
    """A node whose agent does not restore a snapshot as another sandbox (one from before forks,
    or the Docker backend) would restore the child as its parent; once the child has a snapshot
    of its own, any node may restore that."""
    old, new = node("old", slots=5, restores_forks=False), node("new")
    fork = {"forked_from": "p-s1", "fork_parent": "p"}
    child = episode("child", EpisodeState.PREEMPTED, last_snapshot_id="p-s1", **fork)
    (decision,) = scheduler.plan([child], [old, new], NOW)
    assert isinstance(decision, scheduler.RestoreDecision) and decision.node == "new"
    assert scheduler.plan([child], [old], NOW) == []
    moved_on = episode("moved-on", EpisodeState.PREEMPTED, last_snapshot_id="child-s1", snapshots=1, **fork)
    (decision,) = scheduler.plan([moved_on], [old, new], NOW)
    assert decision.node == "old", "the freest: its own snapshot restores anywhere"


def test_memory_and_pinning_are_respected() -> None:
    nodes = [node("a", slots=4, memory_mb=1000), node("b", slots=4)]
    big = episode("big", memory_mb=2000)
    pinned = episode("pinned", state=EpisodeState.PREEMPTED, pinned_node="a", memory_mb=100)
    decisions = scheduler.plan([big, pinned], nodes, NOW)
    assert {d.episode.id: getattr(d, "node", "") for d in decisions} == {"big": "b", "pinned": "a"}


def test_a_node_takes_only_what_its_disk_holds_with_room_to_stage_a_checkpoint() -> None:
    """As the agent counts (`sandbox_agent/node/disk.py`): every layer whole, and beside them the
    largest checkpoint's staging (layer and memory) of the node's episodes."""
    nodes = [node("a", slots=4, disk_mb=32_000), node("b", slots=4, disk_mb=64_000), node("old", slots=4)]
    on_a = episode("on-a", EpisodeState.RUNNING, "a", ran_s=10)  # 10240 + 11264 to stage
    wide = episode("wide", disk_mb=50_000, memory_mb=1024)
    fits_a = episode("fits-a", disk_mb=4096, memory_mb=1024, pinned_node="a")
    too_big = episode("too-big", disk_mb=12_000, memory_mb=1024, pinned_node="a")
    placed = {d.episode.id: d.node for d in scheduler.plan([on_a, wide, fits_a, too_big], nodes[:2], NOW)
              if isinstance(d, scheduler.StartDecision)}  # fmt: skip
    # 10240 + 4096 + 11264 <= 32000, but 10240 + 12000 + 13024 is not; 50000 + 51024 fits nowhere.
    assert placed == {"fits-a": "a"}
    # A node that does not say what its disk holds is not limited by it.
    assert [d.node for d in scheduler.plan([wide], nodes, NOW) if isinstance(d, scheduler.StartDecision)] == [
        "old"
    ]
    # Preempting a running episode frees its layer for the waiter.
    urgent = episode("urgent", disk_mb=12_000, priority=5, pinned_node="a")
    (checkpoint,) = scheduler.plan([on_a, urgent], nodes[:1], NOW)
    assert isinstance(checkpoint, scheduler.CheckpointDecision) and checkpoint.episode.id == "on-a"


def test_the_longest_waiting_resumes_first() -> None:
    nodes = [node("a")]
    waiting = [
        episode("late", state=EpisodeState.PREEMPTED, queued_at=300),
        episode("early", state=EpisodeState.PREEMPTED, queued_at=100),
        episode("middle", queued_at=200),
    ]
    (first,) = scheduler.plan(waiting, nodes, NOW)
    assert isinstance(first, scheduler.RestoreDecision) and first.episode.id == "early"


def test_held_and_backed_off_episodes_wait() -> None:
    waiting = [
        episode("held", state=EpisodeState.PREEMPTED, held=True),
        episode("backoff", not_before=NOW + 5),
    ]
    assert scheduler.plan(waiting, [node("a", slots=4)], NOW) == []


def test_priority_preempts_the_lowest_priority_longest_running() -> None:
    running = [
        episode("low-short", EpisodeState.RUNNING, "a", priority=1, ran_s=10),
        episode("low-long", EpisodeState.RUNNING, "b", priority=1, ran_s=500),
        episode("mid", EpisodeState.RUNNING, "c", priority=5, ran_s=900),
    ]
    urgent = episode("urgent", priority=9)
    decisions = scheduler.plan([*running, urgent], [node("a"), node("b"), node("c")], NOW)
    assert [(d.episode.id, d.reason) for d in decisions if isinstance(d, scheduler.CheckpointDecision)] == [
        ("low-long", Reason.PRIORITY)
    ]
    # Equal priority never preempts.
    assert (
        scheduler.plan([*running, episode("peer", priority=1)], [node("a"), node("b"), node("c")], NOW) == []
    )


def test_time_slice_rotates_only_while_others_wait() -> None:
    nodes = [node("a"), node("b")]
    running = [
        episode("r1", EpisodeState.RUNNING, "a", slice_s=60, ran_s=100),
        episode("r2", EpisodeState.RUNNING, "b", slice_s=60, ran_s=300),
    ]
    assert scheduler.plan(running, nodes, NOW) == [], "nobody waits: no preemption"
    decisions = scheduler.plan([*running, episode("w")], nodes, NOW)
    assert [(d.episode.id, d.reason) for d in decisions] == [("r2", Reason.TIME_SLICE)]
    fresh = [episode("r1", EpisodeState.RUNNING, "a", slice_s=60, ran_s=10)]
    assert scheduler.plan([*fresh, episode("w")], [node("a")], NOW) == [], "a run gets its whole slice"


def test_drain_checkpoints_everything_on_the_node_and_places_nothing_there() -> None:
    nodes = [node("a", slots=2, state=NodeState.DRAINING), node("b", slots=0)]
    running = [episode("r1", EpisodeState.RUNNING, "a"), episode("r2", EpisodeState.RUNNING, "a")]
    decisions = scheduler.plan([*running, episode("new")], nodes, NOW)
    assert sorted((d.episode.id, d.reason) for d in decisions) == [("r1", Reason.DRAIN), ("r2", Reason.DRAIN)]


def test_drain_saves_the_most_unsaved_work_first() -> None:
    nodes = [node("a", slots=4, state=NodeState.DRAINING)]
    running = [
        episode("long-but-saved", EpisodeState.RUNNING, "a", ran_s=3600, last_autosave_at=NOW - 5),
        episode("short", EpisodeState.RUNNING, "a", ran_s=60),
        episode("long", EpisodeState.RUNNING, "a", ran_s=600),
        episode("saved-a-while-ago", EpisodeState.RUNNING, "a", ran_s=3600, last_autosave_at=NOW - 300),
    ]
    decisions = scheduler.plan(running, nodes, NOW)
    assert [d.episode.id for d in decisions] == ["long", "saved-a-while-ago", "short", "long-but-saved"]
    assert "600s unsaved" in decisions[0].why


@pytest.mark.parametrize("state", [NodeState.LOST, NodeState.CORDONED])
def test_unusable_nodes_take_nothing(state: NodeState) -> None:
    assert scheduler.plan([episode("e")], [node("a", state=state)], NOW) == []


def test_autosave_period() -> None:
    e = episode("e", EpisodeState.RUNNING, "a", ran_s=100)
    e.spec = EpisodeSpec(image="base", command=("true",), preemption=Preemption(autosave_s=30))
    (d,) = scheduler.plan([e], [node("a")], NOW)
    assert isinstance(d, scheduler.CheckpointDecision) and d.leave_running and d.reason == Reason.AUTOSAVE
    e.last_autosave_at = NOW - 10
    assert scheduler.plan([e], [node("a")], NOW) == []


def test_a_long_queue_is_read_only_as_far_as_a_decision_can_come_of_it() -> None:
    read: list[str] = []

    def queue(length: int, **kw: object) -> Iterator[Episode]:
        for i in range(length):
            read.append(f"q{i:05}")
            yield episode(f"q{i:05}", queued_at=i, **kw)  # type: ignore[arg-type]

    # Two free slots: two are placed, and the third is read to learn that it must wait.
    decisions = scheduler.plan([], [node("a", slots=2)], NOW, queue=queue(10_000))
    assert [(type(d).__name__, d.episode.id) for d in decisions] == [
        ("StartDecision", "q00000"),
        ("StartDecision", "q00001"),
    ]
    assert len(read) == 3
    # Full, and nobody running has a lower priority or a slice to give up: the head only.
    read.clear()
    running = episode("r", EpisodeState.RUNNING, "a", ran_s=100)
    assert scheduler.plan([running], [node("a")], NOW, queue=queue(10_000)) == []
    assert read == ["q00000"]
    # The first in line that outranks the run preempts it; nobody further back is read.
    read.clear()
    (preempt,) = scheduler.plan([running], [node("a")], NOW, queue=queue(10_000, priority=1))
    assert isinstance(preempt, scheduler.CheckpointDecision) and preempt.reason == Reason.PRIORITY
    assert read == ["q00000"]
    # The queue is read apart from the episodes: one it holds in a state since left is not
    # placed again.
    stale = episode("r", EpisodeState.PREEMPTED, queued_at=-1)
    assert scheduler.plan([running], [node("a", slots=2)], NOW, queue=iter([stale])) == []
