"""Forks through the API and the real control loop, state store and snapshot store, with fake
node agents: children from a snapshot taken now, named or latest; submits from a snapshot; one
checkpoint for concurrent forks; retention that keeps a child's source; and bad input refused."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from orchestrator.api.service import StasisService
from orchestrator.control import AgentUnavailable, ForkMark, RestoreIdentity
from orchestrator.control.retention import collect_snapshots
from orchestrator.domain import EpisodeState, RewardSpec, ids
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.loops import SETTINGS, SPEC, Aborted, Context, Loop

S = EpisodeState


@pytest.fixture
def forks(tmp_path: Path) -> Iterator[tuple[Loop, StasisService]]:
    loop = Loop(tmp_path, replace(SETTINGS, gc_grace_s=0.0))
    loop.register("node-1", "node-2")
    yield loop, StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
    loop.close()


def _fork(service: StasisService, episode_id: str, count: int, **fields: object) -> pb.ForkEpisodeResponse:
    request = pb.ForkEpisodeRequest(episode_id=episode_id, count=count, **fields)  # type: ignore[arg-type]
    return service.ForkEpisode(request, Context())  # type: ignore[arg-type]


def _running_child(loop: Loop, service: StasisService) -> tuple[str, str, str]:
    """A running episode stopped at a fork of one child, and the child once it runs: the
    parent's id, the snapshot's and the child's."""
    parent = loop.running()
    reply = _fork(service, parent, 1, now=True, stop=True)
    child = reply.children[0].id
    loop.until("child running", lambda: loop.state(child) == S.RUNNING)
    return parent, reply.snapshot_id, child


def _refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status code and details the call was refused with."""
    with pytest.raises(Aborted) as err:
        call()
    code, details = err.value.args
    return code, details


@pytest.mark.timeout(60)
def test_a_running_episode_forked_now_runs_on_and_its_3_children_restore_its_snapshot_as_themselves(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent = loop.running()
    reply = _fork(service, parent, 3, now=True, labels={"batch": "b1"})

    assert reply.snapshot_id == ids.snapshot_id(parent, 1)
    assert loop.state(parent) == S.RUNNING, "a fork that does not stop the episode leaves it running"
    children = [c.id for c in reply.children]
    assert len(set(children)) == 3 and parent not in children
    loop.until("3 children running", lambda: all(loop.state(c) == S.RUNNING for c in children))
    addresses = {loop.store.episodes.get(parent).address}
    for index, child_id in enumerate(children):
        child = loop.store.episodes.get(child_id)
        assert (child.forked_from, child.fork_parent, child.fork_index) == (reply.snapshot_id, parent, index)
        assert child.restored_from == reply.snapshot_id and child.runs == 1
        assert child.spec.env["STASIS_FORK_INDEX"] == str(index) and child.spec.labels["batch"] == "b1"
        identity = loop.node(child.node).identities[child.sandbox_id]
        mark = ForkMark(child_id, parent, reply.snapshot_id, index, 3)
        assert identity == RestoreIdentity(address=child.address, hostname=child_id, fork=mark)
        addresses.add(child.address)
    assert len(addresses) == 4, "each child has an address of its own"
    listed = service.ListSnapshots(pb.ListSnapshotsRequest(episode_id=parent), Context())  # type: ignore[arg-type]
    assert [list(s.forks) for s in listed.snapshots] == [children]
    shown = service.GetEpisode(pb.GetEpisodeRequest(episode_id=children[2]), Context())  # type: ignore[arg-type]
    assert (shown.forked_from, shown.fork_parent, shown.fork_index) == (reply.snapshot_id, parent, 2)


@pytest.mark.timeout(60)
def test_a_child_is_an_episode_of_its_own_that_snapshots_and_resumes_without_its_fork_mark(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent, _, child = _running_child(loop, service)
    parent_now = loop.store.episodes.get(parent)
    assert parent_now.state == S.PREEMPTED and parent_now.held, "stopped at the snapshot, held"

    loop.control.commands.preempt(child, "by hand")
    loop.until("child preempted", lambda: loop.state(child) == S.PREEMPTED)
    (own,) = loop.store.snapshots.of(child)
    assert own.parent_id == "", "the store keeps a line within an episode; the fork is the episode's"
    loop.control.commands.resume(child)
    loop.until("child running again", lambda: loop.state(child) == S.RUNNING)
    e = loop.store.episodes.get(child)
    assert e.restored_from == own.id and e.runs == 2
    assert loop.node(e.node).identities[e.sandbox_id] == RestoreIdentity(address=e.address, hostname=e.id)


@pytest.mark.timeout(60)
def test_forks_of_a_named_or_the_latest_snapshot_and_bad_input_refused_naming_the_field(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent, other = loop.running(), loop.running()
    refused = _refused(lambda: _fork(service, parent, 2))
    assert refused[0] == grpc.StatusCode.FAILED_PRECONDITION and "no snapshot to fork" in refused[1]
    first = _fork(service, parent, 1, now=True).snapshot_id
    second = _fork(service, parent, 1, now=True).snapshot_id
    assert _fork(service, parent, 2).snapshot_id == second, "no snapshot named: its latest"
    assert _fork(service, parent, 2, snapshot_id=first).snapshot_id == first

    before = len(loop.store.episodes.query())
    for fields, (code, words) in [
        ({"count": 0}, (grpc.StatusCode.INVALID_ARGUMENT, "count")),
        ({"count": 1001}, (grpc.StatusCode.INVALID_ARGUMENT, "count")),
        ({"stop": True}, (grpc.StatusCode.INVALID_ARGUMENT, "stop")),
        ({"now": True, "snapshot_id": first}, (grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id")),
        ({"snapshot_id": "ep-nope-s1"}, (grpc.StatusCode.NOT_FOUND, "snapshot_id")),
        (
            {"snapshot_id": _fork(service, other, 1, now=True).snapshot_id},
            (grpc.StatusCode.NOT_FOUND, "snapshot_id"),
        ),
        (
            {"group": pb.EpisodeGroup(id="g", task_id="t", size=3)},
            (grpc.StatusCode.INVALID_ARGUMENT, "group.size"),
        ),
    ]:
        request = {"count": 2, **fields}
        count = request.pop("count")
        code_seen, message = _refused(lambda: _fork(service, parent, count, **request))  # noqa: B023
        assert (code_seen, words in message) == (code, True), (fields, message)
    assert len(loop.store.episodes.query()) == before + 1, "only the other episode's fork made a child"


@pytest.mark.timeout(60)
def test_two_concurrent_forks_of_one_running_episode_make_one_checkpoint(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent = loop.running()
    agent = loop.node(loop.store.episodes.get(parent).node)
    gate = agent.hold["checkpoint"] = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        replies = [pool.submit(_fork, service, parent, 2, now=True) for _ in range(2)]
        wait_until(lambda: loop.store.episodes.get(parent).pending_snapshot_id, 10, "the checkpoint asked")
        gate.set()
        snapshots = {r.result(timeout=20).snapshot_id for r in replies}
    assert snapshots == {ids.snapshot_id(parent, 1)}
    assert [c for c in agent.calls if c[0] == "checkpoint"] == [("checkpoint", ids.sandbox_id(parent, 1))]
    assert len(loop.store.snapshots.forks(snapshots)[snapshots.pop()]) == 4


@pytest.mark.timeout(60)
def test_set_up_once_then_8_episodes_start_from_its_snapshot_with_their_own_overrides(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    loop.register("node-3", "node-4", "node-5")  # room for the set-up's child and 8 more
    setup = loop.running()
    source = _fork(service, setup, 1, now=True, stop=True).snapshot_id
    overrides = pb.EpisodeSpec(
        labels={"task": "t-9"}, reward=wire.encode(RewardSpec(command=("grade",)), pb.RewardSpec)
    )
    submits = [
        pb.SubmitEpisodeRequest(spec=overrides, from_snapshot=source, request_id=f"r-{i}") for i in range(8)
    ]
    reply = service.SubmitEpisodes(pb.SubmitEpisodesRequest(submits=submits), Context())  # type: ignore[arg-type]
    started = [e.id for e in reply.episodes]
    again = service.SubmitEpisodes(pb.SubmitEpisodesRequest(submits=submits), Context())  # type: ignore[arg-type]
    assert [e.id for e in again.episodes] == started, "a retry returns the first call's episodes"
    loop.until("8 running", lambda: all(loop.state(e) == S.RUNNING for e in started))
    for index, episode_id in enumerate(started):
        e = loop.store.episodes.get(episode_id)
        assert (e.forked_from, e.fork_index, e.restored_from) == (source, index, source)
        assert e.spec.command == SPEC.command and e.spec.labels["task"] == "t-9"
        assert e.spec.reward is not None and e.spec.reward.command == ("grade",)

    before = len(loop.store.episodes.query())
    for bad, field in [
        (pb.EpisodeSpec(command=["sh"]), "submits[1].spec.command"),
        (pb.EpisodeSpec(env={"A": "1"}), "submits[1].spec.env"),
        (pb.EpisodeSpec(resources=pb.EpisodeResources(cpus=1)), "submits[1].spec.resources"),
    ]:
        batch = [submits[0], pb.SubmitEpisodeRequest(spec=bad, from_snapshot=source)]
        code, message = _refused(
            lambda: service.SubmitEpisodes(pb.SubmitEpisodesRequest(submits=batch), Context())  # type: ignore[arg-type]  # noqa: B023
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in message, message
    code, message = _refused(
        lambda: service.SubmitEpisode(
            pb.SubmitEpisodeRequest(spec=overrides, from_snapshot="ep-x-s1"), Context()
        )  # type: ignore[arg-type]
    )
    assert code == grpc.StatusCode.NOT_FOUND and "from_snapshot" in message
    assert len(loop.store.episodes.query()) == before, "nothing of a refused batch is stored"


@pytest.mark.timeout(60)
def test_retention_keeps_a_childs_source_after_its_parent_ended_and_a_collected_one_is_not_forked(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent = loop.running()
    reply = _fork(service, parent, 1, now=True, stop=True)
    child = reply.children[0].id
    loop.control.commands.cancel(parent)
    collect_snapshots(loop.control.settings, loop.store, loop.snapshots)
    assert loop.snapshots.exists(reply.snapshot_id), "the waiting child anchors it"
    loop.until("child running", lambda: loop.state(child) == S.RUNNING)

    loop.control.commands.cancel(child)
    collect_snapshots(loop.control.settings, loop.store, loop.snapshots)
    assert not loop.snapshots.exists(reply.snapshot_id), "no live episode names it any more"
    code, message = _refused(lambda: _fork(service, parent, 1, snapshot_id=reply.snapshot_id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no longer in the store" in message


@pytest.mark.timeout(60)
def test_a_childs_first_snapshot_whose_reply_was_lost_is_recorded_from_the_store(
    forks: tuple[Loop, StasisService],
) -> None:
    """The snapshot names no parent (the fork's is another episode's): the lost reply is settled
    from the store all the same, not taken for someone else's."""
    loop, service = forks
    _, _, child = _running_child(loop, service)
    agent = loop.node(loop.store.episodes.get(child).node)
    agent.commit_then_fail = AgentUnavailable("reply lost", delay=0.1)
    loop.control.commands.preempt(child, "reply will be lost")
    loop.until("child preempted", lambda: loop.state(child) == S.PREEMPTED)
    (own,) = loop.store.snapshots.of(child)
    assert own.parent_id == "" and loop.store.episodes.get(child).last_snapshot_id == own.id


@pytest.mark.timeout(60)
def test_retention_keeps_the_fork_a_child_with_snapshots_of_its_own_may_run_again_from(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent, source, child = _running_child(loop, service)
    loop.control.commands.preempt(child, "a snapshot of its own")
    loop.until("child preempted", lambda: loop.state(child) == S.PREEMPTED)
    loop.control.commands.cancel(parent)
    collect_snapshots(loop.control.settings, loop.store, loop.snapshots)
    assert loop.snapshots.exists(source), "from_the_start restores it"


@pytest.mark.timeout(60)
def test_a_group_child_whose_fork_cannot_be_restored_fails_naming_it_rather_than_start_over_on_it(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent = loop.running()
    group = pb.EpisodeGroup(id="g-fork", task_id="t", size=2)
    reply = _fork(service, parent, 2, now=True, stop=True, group=group)
    loop.snapshots.delete(reply.snapshot_id)
    children = [c.id for c in reply.children]
    loop.until("both final", lambda: all(loop.state(c).terminal for c in children))
    for c in children:
        e = loop.store.episodes.get(c)
        assert e.state == S.FAILED and reply.snapshot_id in e.reason, e.reason


@pytest.mark.timeout(60)
def test_a_fork_retried_under_its_request_id_returns_its_children_and_takes_no_second_snapshot(
    forks: tuple[Loop, StasisService],
) -> None:
    loop, service = forks
    parent = loop.running()
    first = _fork(service, parent, 2, now=True, request_id="fork-1")
    again = _fork(service, parent, 2, now=True, request_id="fork-1")
    assert [c.id for c in again.children] == [c.id for c in first.children]
    assert again.snapshot_id == first.snapshot_id and len(loop.store.snapshots.of(parent)) == 1
    code, message = _refused(lambda: _fork(service, parent, 3, now=True, request_id="fork-1"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "request" in message, message


@pytest.mark.timeout(60)
def test_a_bad_fork_is_refused_before_the_episode_is_checkpointed(forks: tuple[Loop, StasisService]) -> None:
    loop, service = forks
    parent = loop.running()
    code, message = _refused(lambda: _fork(service, parent, 2, now=True, stop=True, labels={"bad key!": "x"}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("labels."), message
    code, message = _refused(lambda: _fork(service, parent, 2, now=True, request_id="r" * 199))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("request_id:"), message
    assert loop.state(parent) == S.RUNNING and loop.store.snapshots.of(parent) == []
