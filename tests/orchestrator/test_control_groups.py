"""GRPO groups: a group's members run, are graded and come out as one item;
a member lost, broken, stale-bounded (`control/staleness.py`) or cut short by an outage.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from orchestrator.api.service import StasisService
from orchestrator.control.staleness import StalenessBound
from orchestrator.domain import NodeState, Reason, RewardSpec, ids
from orchestrator.trajectory import CanonicalRequest
from orchestrator.trajectory.canonical import canonical_message
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb
from tests.orchestrator.loops import SETTINGS, SPEC, Aborted, Context, Loop, S

# GRPO groups ----------------------------------------------------------------------------------

GRADED = replace(SPEC, reward=RewardSpec(command=("python3", "/grade.py")))


class _Streaming:
    """The servicer context a stream in progress sees: the caller is still there."""

    def is_active(self) -> bool:
        return True


def _submit_group(service: StasisService, group: pb.EpisodeGroup, n: int | None = None) -> list[str]:
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    submits = [
        pb.SubmitEpisodeRequest(spec=spec, request_id=f"{group.id}/{i}") for i in range(n or group.size)
    ]
    reply = service.SubmitEpisodes(pb.SubmitEpisodesRequest(submits=submits, group=group), None)  # type: ignore[arg-type]
    return [e.id for e in reply.episodes]


def _group_item(service: StasisService) -> tuple[pb.GroupResult, list[str]]:
    """A stream's first group item, and the episodes whose trajectories came before it."""
    request = pb.StreamTrajectoriesRequest(include_groups=True)
    stream = service.StreamTrajectories(request, _Streaming())  # type: ignore[arg-type]
    try:
        before = []
        for item in stream:
            if item.HasField("group"):
                assert item.episode_id == "", "a group item carries no episode"
                return item.group, before
            before.append(item.episode_id)
    finally:
        stream.close()
    raise AssertionError("no group item")


def _finish_running(loop: Loop, members: list[str]) -> None:
    """Every member that runs now exits 0 (its harness is done); the verifier gives its reward."""
    for episode_id in members:
        e = loop.store.episodes.get(episode_id)
        if e.state == S.RUNNING and e.sandbox_id in loop.node(e.node).sandboxes:
            loop.node(e.node).exit(e.sandbox_id, 0)


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[tuple[Loop, StasisService]]:
    loop = Loop(tmp_path)
    loop.register("node-1", "node-2", "node-3", "node-4", "node-5")
    yield loop, StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
    loop.close()


@pytest.mark.timeout(60)
def test_a_group_item_comes_once_all_8_members_are_final_with_their_8_rewards(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-1", task_id="task-7", size=8))
    for index, episode_id in enumerate(members):
        e = loop.store.episodes.get(episode_id)
        assert (e.group_id, e.group_index) == ("g-1", index)
        loop.agents.verifier_logs[episode_id] = f"grading...\n{index / 8}\n".encode()
    shown = service.GetEpisode(pb.GetEpisodeRequest(episode_id=members[3]), None)  # type: ignore[arg-type]
    assert (shown.group_id, shown.group_index) == ("g-1", 3)
    loop.until("all 8 running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    _finish_running(loop, members[:7])
    loop.until("7 final", lambda: sum(loop.state(m).terminal for m in members) == 7)
    (listed,) = service.ListGroups(pb.ListGroupsRequest(), None).groups  # type: ignore[arg-type]
    assert (listed.final, listed.complete, listed.broken) == (7, False, False)

    _finish_running(loop, members[7:])
    loop.until("all final", lambda: all(loop.state(m).terminal for m in members))
    group, before = _group_item(service)
    assert (group.id, group.task_id, group.size, group.final) == ("g-1", "task-7", 8, 8)
    assert group.complete and not group.broken and group.problem == ""
    assert [(m.index, m.episode_id) for m in group.members] == list(enumerate(members))
    assert [m.reward for m in group.members] == [i / 8 for i in range(8)]
    assert all(m.has_reward and m.state == pb.EPISODE_STATE_SUCCEEDED for m in group.members)
    assert sorted(before) == sorted(members), "after the trajectories of all 8, once"
    assert before[-1] == max(members, key=lambda m: loop.store.episodes.get(m).finished_at)


@pytest.mark.timeout(60)
def test_a_member_whose_node_is_lost_mid_run_runs_again_and_the_group_completes_with_real_rewards(
    tmp_path: Path,
) -> None:
    """The member goes back to its autosave and is restored elsewhere; its reward is its
    verifier's, from the run that finished, and nothing is made up for the run that was lost."""
    loop = Loop(tmp_path, replace(SETTINGS, node_lost_after_s=0.5))
    try:
        loop.register("node-1", "node-2", "node-3", "node-4", "node-5")
        service = StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
        members = _submit_group(service, pb.EpisodeGroup(id="g-2", task_id="task-7", size=8))
        for index, episode_id in enumerate(members):
            loop.agents.verifier_logs[episode_id] = f"{index + 1}\n".encode()
        loop.until("all 8 running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
        hit = members[3]
        loop.control.operations.begin_checkpoint(hit, Reason.AUTOSAVE, "save", leave_running=True)
        loop.until("an autosave", lambda: loop.store.episodes.get(hit).snapshots == 1)
        lost = loop.store.episodes.get(hit).node
        on_lost = [m for m in members if loop.store.episodes.get(m).node == lost]
        loop.silent.add(lost)
        loop.until("the node lost", lambda: loop.store.nodes.get(lost).state == NodeState.LOST)
        assert loop.state(hit) in (S.PREEMPTED, S.RESTORING, S.RUNNING)
        _finish_running(loop, [m for m in members if m not in on_lost])
        loop.until("the lost node's members running elsewhere", lambda: all(
            loop.store.episodes.get(m).node not in ("", lost) and loop.state(m) == S.RUNNING for m in on_lost
        ))  # fmt: skip
        assert loop.store.episodes.get(hit).restored_from == ids.snapshot_id(hit, 1)
        assert loop.store.episodes.get(hit).runs == 2
        _finish_running(loop, on_lost)
        loop.until("all final", lambda: all(loop.state(m).terminal for m in members))

        group, _ = _group_item(service)
        assert group.complete and group.final == 8
        assert [m.reward for m in group.members] == [float(i + 1) for i in range(8)]
        assert {m.state for m in group.members} == {pb.EPISODE_STATE_SUCCEEDED}
    finally:
        loop.close()


@pytest.mark.timeout(60)
def test_a_group_with_a_cancelled_member_says_it_cannot_complete_and_which_member(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-3", task_id="task-1", size=3))
    loop.until("all running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    loop.control.commands.cancel(members[1])
    loop.until("cancelled", lambda: loop.state(members[1]) == S.CANCELLED)
    group, before = _group_item(service)
    assert group.broken and not group.complete and group.final == 1
    assert (group.broken_by.index, group.broken_by.episode_id) == (1, members[1])
    assert group.broken_by.state == pb.EPISODE_STATE_CANCELLED and not group.broken_by.has_reward
    assert f"member 1 ({members[1]}) cancelled without a reward" in group.problem, group.problem
    assert before == [members[1]]


@pytest.mark.timeout(60)
def test_a_member_whose_snapshot_cannot_be_restored_starts_over_rather_than_fail(
    groups: tuple[Loop, StasisService],
) -> None:
    """Where an episode alone would fail (its only snapshot vouched for by no digest), a group's
    member runs again from the beginning."""
    loop, service = groups
    (member,) = _submit_group(service, pb.EpisodeGroup(id="g-4", task_id="task-1", size=1))
    loop.until("running", lambda: loop.state(member) == S.RUNNING)
    loop.node(loop.store.episodes.get(member).node).reports_digest = False
    loop.control.commands.preempt(member, "move")
    loop.until("PREEMPTED", lambda: loop.state(member) == S.PREEMPTED)
    loop.control.commands.resume(member)
    # Run 2 was the restore that could not be made; run 3 starts from the spec.
    loop.until(
        "running again", lambda: loop.state(member) == S.RUNNING and loop.store.episodes.get(member).runs == 3
    )
    e = loop.store.episodes.get(member)
    assert (e.restored_from, e.last_snapshot_id, e.log_offsets[:2]) == ("", "", (-1, -1))
    reasons = [ev.reason for ev in loop.store.events.read(0, [member])]
    assert any("has no recorded manifest digest" in r and "member 0 starts over" in r for r in reasons)


def _sampled(loop: Loop, episode_id: str, version: str, text: str = "go") -> None:
    """A turn the gateway sampled for the episode's current run under `version`."""
    e = loop.store.episodes.get(episode_id)
    request = CanonicalRequest.parse("chat", {"model": "m", "messages": [{"role": "user", "content": text}]})
    answer = canonical_message({"role": "assistant", "content": "ok"})
    loop.ledger.record(episode_id, e.runs, 0.0, request, b"{}", answer, b"", "chat", b"", [5, 6], [-0.5, -0.5],
                       [1, 2], version, 1.0)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_member_whose_next_turn_would_exceed_max_staleness_runs_again_from_the_start(
    groups: tuple[Loop, StasisService],
) -> None:
    """Group g-5 (max_staleness 1): member 0's oldest tokens fall 2 versions behind and it runs
    again from the spec, not its snapshot; member 1, 1 behind, and an unbounded group's member,
    2 behind, run on. The group completes with every member's own verifier's reward."""
    loop, service = groups
    bounded = _submit_group(service, pb.EpisodeGroup(id="g-5", task_id="task-1", size=2, max_staleness=1))
    (free,) = _submit_group(service, pb.EpisodeGroup(id="g-6", task_id="task-1", size=1))
    for index, episode_id in enumerate([*bounded, free]):
        loop.agents.verifier_logs[episode_id] = f"{index + 1}\n".encode()
    everyone = [*bounded, free]
    loop.until("all running", lambda: {loop.state(m) for m in everyone} == {S.RUNNING})
    stale, fresh = bounded
    loop.ledger.policy.publish(3)
    _sampled(loop, stale, "3")
    _sampled(loop, free, "3")
    loop.ledger.policy.publish(4)
    _sampled(loop, fresh, "4")
    _sampled(loop, stale, "4", "more")
    loop.control.operations.begin_checkpoint(stale, Reason.AUTOSAVE, "save", leave_running=True)
    loop.until("an autosave", lambda: loop.store.episodes.get(stale).snapshots == 1)
    loop.until("some ticks within the bound", lambda: True)
    assert {loop.store.episodes.get(m).runs for m in everyone} == {1}, "1 version behind: within the bound"

    first = loop.store.episodes.get(stale)
    loop.ledger.policy.publish(5)
    loop.until(
        "member 0 running again",
        lambda: loop.store.episodes.get(stale).runs == 2 and loop.state(stale) == S.RUNNING,
    )
    again = loop.store.episodes.get(stale)
    assert (again.restored_from, again.last_snapshot_id, again.log_offsets[:1]) == ("", "", (-1,))
    assert ("delete", first.sandbox_id) in loop.node(first.node).calls
    reasons = [ev.reason for ev in loop.store.events.read(0, [stale])]
    assert any(
        "stale-bounded: its oldest live tokens are 2 policy versions behind the published version 5, past its "
        "group's max_staleness 1; group g-5's member 0 runs again from the start" in r
        for r in reasons
    ), reasons
    assert [t.abandoned for t in loop.ledger.turns(stale)] == [True, True], "never replayed to the new run"
    assert loop.store.episodes.get(fresh).runs == loop.store.episodes.get(free).runs == 1
    assert [t.abandoned for t in loop.ledger.turns(fresh) + loop.ledger.turns(free)] == [False, False]

    _sampled(loop, stale, "5")  # the new run's first turn, under the published version
    loop.until("some ticks", lambda: True)
    assert loop.store.episodes.get(stale).runs == 2, "the new run is within the bound"
    _finish_running(loop, everyone)
    loop.until("all final", lambda: all(loop.state(m).terminal for m in everyone))
    listed = {g.id: g for g in service.ListGroups(pb.ListGroupsRequest(), None).groups}  # type: ignore[arg-type]
    assert listed["g-5"].complete and [m.reward for m in listed["g-5"].members] == [1.0, 2.0]
    assert listed["g-6"].complete and [m.reward for m in listed["g-6"].members] == [3.0]


@pytest.mark.timeout(60)
def test_a_tick_reads_the_published_version_and_a_groups_bound_once_for_all_its_members(
    groups: tuple[Loop, StasisService],
) -> None:
    """Three bounded members within their bound: telling each costs its own live versions, but
    the published version and the group's bound are read once per tick, not once per member."""
    loop, service = groups
    members = _submit_group(service, pb.EpisodeGroup(id="g-9", task_id="task-1", size=3, max_staleness=1))
    loop.until("all running", lambda: {loop.state(m) for m in members} == {S.RUNNING})
    loop.ledger.policy.publish(3)
    for m in members:
        _sampled(loop, m, "3")
    reads: list[str] = []

    class Counted:  # the loop's own store and ledger, each read counted; its ticks run on apart
        def __init__(self, inner: object, name: str) -> None:
            self.inner, self.name = inner, name

        def __getattr__(self, attr: str) -> object:
            if attr in ("groups", "published"):
                reads.append(attr)
            value = getattr(self.inner, attr)
            return Counted(value, attr) if attr == "policy" else value

    bound = StalenessBound(Counted(loop.store, "store"), Counted(loop.ledger, "ledger"), loop.control.members)  # type: ignore[arg-type]
    bound.new_tick()
    assert [bound.why(loop.store.episodes.get(m)) for m in members] == ["", "", ""]
    assert reads == ["groups", "published"]
    bound.new_tick()
    assert bound.why(loop.store.episodes.get(members[0])) == ""
    assert reads == ["groups", "published"] * 2, "a new tick reads them afresh"


@pytest.mark.timeout(60)
def test_a_member_whose_run_an_upstream_outage_cut_short_runs_again_and_is_graded_on_a_whole_run(
    tmp_path: Path,
) -> None:
    """Member 0's harness exits 1 when the last thing its run had was the model server failing:
    it is not graded on that run but runs again (from the start: it has no snapshot). Member 1's
    model server failed too, but a turn followed, so its exit is its own and it is graded. Past
    `group_max_attempts` such runs a member fails naming the outage, with no reward."""
    loop = Loop(tmp_path, replace(SETTINGS, group_max_attempts=3))
    loop.register("node-1", "node-2")
    service = StasisService(loop.control, loop.store, loop.snapshots, loop.ledger)
    try:
        cut, own = _submit_group(service, pb.EpisodeGroup(id="g-up", task_id="task-1", size=2))
        loop.agents.verifier_logs[cut] = loop.agents.verifier_logs[own] = b"0.5\n"
        loop.until("both running", lambda: {loop.state(m) for m in (cut, own)} == {S.RUNNING})
        loop.ledger.outages.failed(cut, 1, "model server: 502 connection refused")
        loop.ledger.outages.failed(own, 1, "model server: 502 connection refused")
        time.sleep(0.01)
        _sampled(loop, own, "1")
        first = loop.store.episodes.get(cut)
        for m in (cut, own):
            e = loop.store.episodes.get(m)
            loop.node(e.node).exit(e.sandbox_id, 1)
        loop.until("member 1 graded", lambda: loop.state(own) == S.SUCCEEDED)
        assert loop.store.episodes.get(own).reward == 0.5
        loop.until(
            "member 0 running again",
            lambda: loop.store.episodes.get(cut).runs == 2 and loop.state(cut) == S.RUNNING,
        )
        assert loop.store.episodes.get(cut).reward is None and loop.ledger.verifications.get(cut) is None, (
            "never graded"
        )
        assert ("delete", first.sandbox_id) in loop.node(first.node).calls
        reasons = [ev.reason for ev in loop.store.events.read(0, [cut])]
        assert any(
            "harness exited with code 1 after the model server failed its run: model server: 502 connection "
            "refused; no snapshot yet, starting over" in r
            for r in reasons
        ), reasons

        for run in (2, 3):  # the outage goes on: the third run so ended is past group_max_attempts
            loop.until(
                f"run {run}",
                lambda run=run: loop.store.episodes.get(cut).runs == run and loop.state(cut) == S.RUNNING,
            )
            loop.ledger.outages.failed(cut, run, "model server: 503 overloaded")
            e = loop.store.episodes.get(cut)
            loop.node(e.node).exit(e.sandbox_id, 1)
        loop.until("member 0 failed", lambda: loop.state(cut) == S.FAILED)
        final = loop.store.episodes.get(cut)
        assert final.reward is None and final.reason == (
            "harness exited with code 1 after the model server failed its run: model server: 503 overloaded; "
            "3 runs ended so, past group_max_attempts"
        )
        (group,) = service.ListGroups(pb.ListGroupsRequest(), None).groups  # type: ignore[arg-type]
        assert group.broken and "model server: 503 overloaded" in group.problem
    finally:
        loop.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("group", "submits", "field"),
    [
        (pb.EpisodeGroup(id="g", task_id="t", size=0), 1, "group.size"),
        (pb.EpisodeGroup(id="g", task_id="t", size=1001), 1001, "group.size"),
        (pb.EpisodeGroup(id="g", task_id="t", size=3), 2, "group.size"),
        (pb.EpisodeGroup(id="", task_id="t", size=1), 1, "group.id"),
        (pb.EpisodeGroup(id="g g", task_id="t", size=1), 1, "group.id"),
        (pb.EpisodeGroup(id="g", task_id="", size=1), 1, "group.task_id"),
        (pb.EpisodeGroup(id="g", task_id="t", size=1, max_staleness=-1), 1, "group.max_staleness"),
        (pb.EpisodeGroup(id="taken", task_id="t", size=3), 3, "group.size"),
        (pb.EpisodeGroup(id="taken", task_id="other", size=2), 2, "group.task_id"),
    ],
)
def test_bad_group_input_is_refused_naming_the_field_and_nothing_is_stored(
    groups: tuple[Loop, StasisService], group: pb.EpisodeGroup, submits: int, field: str
) -> None:
    loop, service = groups
    _submit_group(service, pb.EpisodeGroup(id="taken", task_id="t", size=2))
    stored, events = loop.store.episodes.query(), loop.store.events.read()
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    request = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec)] * submits, group=group)
    with pytest.raises(Aborted) as err:
        service.SubmitEpisodes(request, Context())  # type: ignore[arg-type]
    code, details = err.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}: "), details
    assert loop.store.episodes.query() == stored and loop.store.events.read() == events
    assert [g.id for g in loop.store.groups.all()] == ["taken"]


@pytest.mark.timeout(30)
def test_a_group_submitted_again_returns_its_members_and_new_members_are_refused(
    groups: tuple[Loop, StasisService],
) -> None:
    loop, service = groups
    group = pb.EpisodeGroup(id="g-5", task_id="t", size=2)
    first = _submit_group(service, group)
    assert _submit_group(service, group) == first, "a retry with the same request ids"
    spec = wire.encode(GRADED, pb.EpisodeSpec)
    fresh = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec)] * 2, group=group)
    with pytest.raises(Aborted, match=r"group.id: group 'g-5' has its member 0 already"):
        service.SubmitEpisodes(fresh, Context())  # type: ignore[arg-type]
    assert [e.id for e in loop.store.groups.members("g-5")] == first
