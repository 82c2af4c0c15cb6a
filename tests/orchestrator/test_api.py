"""The public API's contract over a real channel: status codes, named fields, idempotency."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator import FailedPrecondition, InvalidArgument, NotFound, StasisClient
from orchestrator.api.streams import API_WORKERS, MAX_STREAMS
from orchestrator.cli.local import LocalStack
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from tests.orchestrator.conftest import cli, wait_until
from tests.orchestrator.programs import counter_spec


@pytest.fixture
def api(make_stack: Callable[..., LocalStack]) -> Iterator[tuple[pb_grpc.StasisStub, StasisClient]]:
    stack = make_stack(nodes=1, slots=2, secure=False)  # raw stubs; authentication is test_auth's
    channel = grpc.insecure_channel(stack.address)
    with stack.client() as client:
        yield pb_grpc.StasisStub(channel), client
    channel.close()


def _status(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()  # type: ignore[attr-defined]


def _spec(**changes: object) -> pb.EpisodeSpec:
    spec = pb.EpisodeSpec(image="base", command=["true"])
    for key, value in changes.items():
        if isinstance(value, dict):
            getattr(spec, key).update(value)
        elif isinstance(value, list):
            del getattr(spec, key)[:]
            getattr(spec, key).extend(value)
        else:
            setattr(spec, key, value)
    return spec


MALFORMED = [
    (_spec(entrypoint=[""], has_entrypoint=True), "spec.entrypoint[0]"),
    (_spec(command=[""]), "spec.command[0]"),
    (_spec(image=""), "spec.image"),
    (_spec(image="no-such-image"), "spec.image"),
    (_spec(env={"1X": "y"}), "spec.env.1X"),
    (_spec(files={"relative.txt": b"x"}), "spec.files.relative.txt"),
    (
        pb.EpisodeSpec(image="base", command=["true"], resources=pb.EpisodeResources(memory_mb=4)),
        "spec.resources.memory_mb",
    ),
    (
        pb.EpisodeSpec(image="base", command=["true"], preemption=pb.Preemption(time_slice_s=-1)),
        "spec.preemption.time_slice_s",
    ),
    (
        pb.EpisodeSpec(image="base", command=["true"], limits=pb.Limits(max_wall_s=-5)),
        "spec.limits.max_wall_s",
    ),
    (pb.EpisodeSpec(image="base", command=["true"], reward=pb.RewardSpec()), "spec.reward.command"),
    (_spec(labels={"bad key!": "v"}), "spec.labels.bad key!"),
    (_spec(command=["python3", "-c", "print(1)\0"]), "spec.command[2]"),
    (_spec(image="ba\0se"), "spec.image"),
    (_spec(labels={"team": "a\0b"}), "spec.labels.team"),
    (_spec(labels={"te\0am": "ab"}), "spec.labels.te\\0am"),
    (
        pb.EpisodeSpec(image="base", command=["true"], reward=pb.RewardSpec(command=["\0"])),
        "spec.reward.command[0]",
    ),
    # Durations: finite, and long enough or short enough to be carried out (a verifier's deadline
    # of 1e12 s overflows gRPC's; an autosave every nanosecond checkpoints on every tick).
    *[
        (
            pb.EpisodeSpec(image="base", command=["true"], reward=pb.RewardSpec(command=["v"], timeout_s=t)),
            field,
        )
        for t, field in ((1e12, "spec.reward.timeout_s"), (float("nan"), "spec.reward.timeout_s"))
    ],
    *[
        (
            pb.EpisodeSpec(image="base", command=["true"], preemption=pb.Preemption(**{name: value})),
            f"spec.preemption.{name}",
        )
        for name in ("autosave_s", "time_slice_s")
        for value in (1e-9, float("inf"), float("nan"), 1e9)
    ],
    (
        pb.EpisodeSpec(image="base", command=["true"], limits=pb.Limits(max_wall_s=float("nan"))),
        "spec.limits.max_wall_s",
    ),
    # Two keys for one file, and paths no node would write.
    (_spec(files={"/a/./b": b"1"}), "spec.files./a/./b"),
    (_spec(files={"/a//b": b"1"}), "spec.files./a//b"),
    (_spec(files={"/.": b"1"}), "spec.files./."),
    (_spec(files={"/dir/": b"1"}), "spec.files./dir/"),
    (_spec(env={"FOO\n": "y"}), "spec.env.FOO\n"),
    (_spec(labels={"team\n": "y"}), "spec.labels.team\n"),
    (_spec(image="base\n"), "spec.image"),
    (_spec(entrypoint=["/bin/sh", "-c"]), "spec.entrypoint"),
]


@pytest.mark.timeout(90)
def test_malformed_specs_name_the_field_and_store_nothing(
    api: tuple[pb_grpc.StasisStub, StasisClient],
) -> None:
    stub, client = api
    for spec, field in MALFORMED:
        code, details = _status(lambda spec=spec: stub.SubmitEpisode(pb.SubmitEpisodeRequest(spec=spec)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details.startswith(f"{field}: "), details
    code, details = _status(lambda: stub.SubmitEpisode(pb.SubmitEpisodeRequest()))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("spec:")
    assert client.episodes() == []
    assert client.events() == [e for e in client.events() if e.kind == "node"]
    with pytest.raises(InvalidArgument) as err:
        client.submit({"image": "base", "command": "true"})
    assert err.value.field == "spec.command"


@pytest.mark.timeout(90)
def test_episodes_are_listed_a_page_at_a_time_in_submission_order(
    api: tuple[pb_grpc.StasisStub, StasisClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    stub, client = api
    submitted = [
        stub.SubmitEpisode(pb.SubmitEpisodeRequest(spec=_spec(labels={"team": "ab"[i % 2]}))).id
        for i in range(7)
    ]
    pages, request = [], pb.ListEpisodesRequest(labels={"team": "a"}, page_size=2)
    while True:
        page = stub.ListEpisodes(request)
        pages.append([e.id for e in page.episodes])
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    team_a = submitted[::2]
    assert pages == [team_a[:2], team_a[2:], []], "a full page may be followed by an empty last one"
    assert [e.id for e in stub.ListEpisodes(pb.ListEpisodesRequest()).episodes] == submitted, "size 0: all"
    monkeypatch.setattr("orchestrator.client.client.LIST_PAGE", 3)
    assert [e.id for e in client.episodes()] == submitted
    for bad, field in (
        (pb.ListEpisodesRequest(page_token="bm90IGEgdG9rZW4="), "page_token"),
        (pb.ListEpisodesRequest(page_token="#"), "page_token"),
        (pb.ListEpisodesRequest(page_size=-1), "page_size"),
    ):
        code, details = _status(lambda bad=bad: stub.ListEpisodes(bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}: "), details


@pytest.mark.timeout(90)
def test_a_batch_of_submits_is_accepted_whole_or_refused_whole(
    api: tuple[pb_grpc.StasisStub, StasisClient],
) -> None:
    stub, client = api

    def batch(*specs: pb.EpisodeSpec, ids: tuple[str, ...] = ()) -> pb.SubmitEpisodesRequest:
        return pb.SubmitEpisodesRequest(
            submits=[
                pb.SubmitEpisodeRequest(spec=spec, request_id=ids[i] if ids else "")
                for i, spec in enumerate(specs)
            ]
        )

    refusals = [
        (pb.SubmitEpisodesRequest(), "submits: is empty"),
        (batch(*[_spec()] * 1001), "submits: has 1001 entries; at most 1000"),
        (batch(_spec(), pb.EpisodeSpec()), "submits[1].spec.image: "),
        *[(batch(_spec(), _spec(), spec), f"submits[2].{field}: ") for spec, field in MALFORMED],
    ]
    for request, details in refusals:
        code, got = _status(lambda request=request: stub.SubmitEpisodes(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and got.startswith(details), got
    assert client.episodes() == []

    taken = stub.SubmitEpisode(pb.SubmitEpisodeRequest(spec=_spec(command=["sleep", "30"]), request_id="t-1"))
    code, details = _status(lambda: stub.SubmitEpisodes(batch(_spec(), _spec(), ids=("t-2", "t-1"))))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "t-1" in details
    assert [e.id for e in client.episodes()] == [taken.id], "a refused batch left part of itself behind"

    request = batch(*(_spec(command=["sleep", str(30 + i)]) for i in range(3)), ids=("g-0", "g-1", "g-2"))
    accepted = stub.SubmitEpisodes(request).episodes
    assert [list(e.spec.command) for e in accepted] == [["sleep", str(30 + i)] for i in range(3)]
    assert len({e.id for e in accepted}) == 3 and taken.id not in {e.id for e in accepted}
    assert [e.id for e in stub.SubmitEpisodes(request).episodes] == [e.id for e in accepted]  # a retry
    assert len(client.episodes()) == 4

    with pytest.raises(InvalidArgument) as err:
        client.submit_many([{"image": "base", "command": ["true"]}, {"image": "base", "command": "true"}])
    assert err.value.field == "submits[1].spec.command"
    assert len(client.submit_many([{"image": "base", "command": ["true"]}] * 2)) == 2


@pytest.mark.timeout(180)
def test_the_cli_submits_a_group_and_lists_it_with_its_rewards(
    make_stack: Callable[..., LocalStack], tmp_path: Path
) -> None:
    """`stasis submit -n 3 --group G` and `stasis groups`, over a real stack: each member's reward
    is what its verifier read of the answer the member's harness wrote."""
    stack = make_stack(nodes=1, slots=3, secure=False)
    spec = tmp_path / "add.yaml"
    spec.write_text(json.dumps({
        "image": "base", "command": ["sh", "-c", "echo 0.5 > /answer"],
        "reward": {"command": ["cat", "/episode/answer"]},
    }))  # fmt: skip
    members = cli(stack.address, "submit", "-f", str(spec), "-n", "3", "--group", "g-cli").stdout.split()
    assert len(members) == 3
    with stack.client() as client:
        assert [(e.group_id, e.group_index) for e in map(client.get, members)] == [
            ("g-cli", i) for i in range(3)
        ]
        for episode_id in members:
            client.wait(episode_id, ["SUCCEEDED"], timeout_s=120)

        (group,) = json.loads(cli(stack.address, "groups", "-o", "json").stdout)["items"]
        assert (group["id"], group["task_id"], group["size"], group["final"], group["complete"]) == (
            "g-cli", "add", 3, 3, True,
        )  # fmt: skip
        assert [m["reward"] for m in group["members"]] == [0.5, 0.5, 0.5]
        table = cli(stack.address, "groups").stdout.splitlines()
        assert table[0].split() == ["GROUP", "TASK", "FINAL", "STATUS", "REWARDS"]
        assert table[1].split() == ["g-cli", "add", "3/3", "complete", "0.5", "0.5", "0.5"]

        again = cli(stack.address, "submit", "-f", str(spec), "-n", "2", "--group", "g-cli", check=False)
        assert again.returncode == 1 and again.stderr.startswith("stasis: group.size: "), again.stderr
        assert len(client.episodes()) == 3, "nothing stored"


@pytest.mark.timeout(90)
def test_unknown_ids_are_not_found(api: tuple[pb_grpc.StasisStub, StasisClient]) -> None:
    stub, _ = api
    calls = {
        "GetEpisode": lambda: stub.GetEpisode(pb.GetEpisodeRequest(episode_id="ep-nope")),
        "CancelEpisode": lambda: stub.CancelEpisode(pb.CancelEpisodeRequest(episode_id="ep-nope")),
        "PreemptEpisode": lambda: stub.PreemptEpisode(pb.PreemptEpisodeRequest(episode_id="ep-nope")),
        "ResumeEpisode": lambda: stub.ResumeEpisode(pb.ResumeEpisodeRequest(episode_id="ep-nope")),
        "ListSnapshots": lambda: stub.ListSnapshots(pb.ListSnapshotsRequest(episode_id="ep-nope")),
        "ListEvents": lambda: stub.ListEvents(pb.ListEventsRequest(episode_id="ep-nope")),
        "DrainNode": lambda: stub.DrainNode(pb.DrainNodeRequest(node="node-9")),
        "UncordonNode": lambda: stub.UncordonNode(pb.UncordonNodeRequest(node="node-9")),
        "WatchEpisodes": lambda: next(stub.WatchEpisodes(pb.WatchEpisodesRequest(episode_ids=["ep-nope"]))),
    }
    for name, call in calls.items():
        code, details = _status(call)
        assert code == grpc.StatusCode.NOT_FOUND, name
        assert "nope" in details or "node-9" in details, details


@pytest.mark.timeout(60)
def test_text_with_a_nul_is_refused_by_field_before_any_handler_runs(
    api: tuple[pb_grpc.StasisStub, StasisClient],
) -> None:
    stub, client = api
    taken = client.submit({"image": "base", "command": ["sleep", "30"]})
    calls = {
        "request_id": lambda: stub.SubmitEpisode(pb.SubmitEpisodeRequest(spec=_spec(), request_id="t\0")),
        "episode_id": lambda: stub.GetEpisode(pb.GetEpisodeRequest(episode_id=taken.id + "\0")),
        "reason": lambda: stub.PreemptEpisode(pb.PreemptEpisodeRequest(episode_id=taken.id, reason="\0")),
        "node": lambda: stub.DrainNode(pb.DrainNodeRequest(node="node-1\0")),
        "episode_ids[1]": lambda: next(
            stub.WatchEpisodes(pb.WatchEpisodesRequest(episode_ids=[taken.id, "\0"]))
        ),
    }
    for field, call in calls.items():
        code, details = _status(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details == f"{field}: must not contain a NUL character"
    assert [e.id for e in client.episodes()] == [taken.id]
    assert [n.state for n in client.nodes()] == ["READY"], "the drain was carried out"


@pytest.mark.timeout(120)
def test_state_rules_are_failed_precondition(api: tuple[pb_grpc.StasisStub, StasisClient]) -> None:
    stub, client = api
    done = client.submit({"image": "base", "command": ["true"]})
    client.wait(done.id, ["SUCCEEDED"], timeout_s=60)
    for call in (
        lambda: stub.PreemptEpisode(pb.PreemptEpisodeRequest(episode_id=done.id)),
        lambda: stub.ResumeEpisode(pb.ResumeEpisodeRequest(episode_id=done.id)),
        lambda: stub.CancelEpisode(pb.CancelEpisodeRequest(episode_id=done.id)),
    ):
        code, details = _status(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "SUCCEEDED" in details, details

    running = client.submit(counter_spec(400))
    client.wait(running.id, ["RUNNING"], timeout_s=60)
    with pytest.raises(FailedPrecondition, match="only PREEMPTED episodes can be resumed"):
        client.resume(running.id)
    client.preempt(running.id)
    with pytest.raises(FailedPrecondition):
        client.preempt(running.id)
    client.wait(running.id, ["PREEMPTED"], timeout_s=60)
    with pytest.raises(NotFound, match="node-9"):
        client.resume(running.id, node="node-9")
    assert client.cancel(running.id).state == "CANCELLED"
    assert client.get(running.id).state == "CANCELLED"


@pytest.mark.timeout(90)
def test_request_ids_make_changes_idempotent(api: tuple[pb_grpc.StasisStub, StasisClient]) -> None:
    stub, client = api
    request = pb.SubmitEpisodeRequest(spec=_spec(command=["sleep", "30"]), request_id="trainer-42")
    first = stub.SubmitEpisode(request)
    again = stub.SubmitEpisode(request)
    assert first.id == again.id and len(client.episodes()) == 1
    other = pb.SubmitEpisodeRequest(spec=_spec(command=["sleep", "31"]), request_id="trainer-42")
    code, details = _status(lambda: stub.SubmitEpisode(other))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "trainer-42" in details
    client.wait(first.id, ["RUNNING"], timeout_s=60)
    cancel = pb.CancelEpisodeRequest(episode_id=first.id, request_id="cancel-1")
    assert stub.CancelEpisode(cancel).state == pb.EPISODE_STATE_CANCELLED
    assert stub.CancelEpisode(cancel).state == pb.EPISODE_STATE_CANCELLED  # a retry, not an error
    # Retries that race each other: one preempts, the others find it done.
    second = client.submit(counter_spec(100000))
    client.wait(second.id, ["RUNNING"], timeout_s=60)
    racing = pb.PreemptEpisodeRequest(episode_id=second.id, request_id="preempt-race")
    with ThreadPoolExecutor(max_workers=6) as pool:
        replies = list(pool.map(lambda _: stub.PreemptEpisode(racing), range(6)))
    assert len(replies) == 6 and {r.id for r in replies} == {second.id}
    client.wait(second.id, ["PREEMPTED"], timeout_s=60)
    frozen = [e for e in client.events(second.id) if e.to_state == "CHECKPOINTING"]
    assert len(frozen) == 1, frozen
    client.cancel(second.id)
    # A request that failed leaves its id unused: the retry fails the same way.
    refused = pb.PreemptEpisodeRequest(episode_id=first.id, request_id="preempt-1")
    for _ in range(2):
        assert _status(lambda: stub.PreemptEpisode(refused))[0] == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.timeout(60)
def test_watch_streams_transitions_live(api: tuple[pb_grpc.StasisStub, StasisClient]) -> None:
    _, client = api
    episode = client.submit({"image": "base", "command": ["sh", "-c", "sleep 1"]})
    seen = []
    for event in client.watch([episode.id]):
        if event.kind == "transition":
            seen.append(event.to_state)
        if event.to_state == "SUCCEEDED":
            break
    assert seen == ["PENDING", "RUNNING", "SUCCEEDED"]
    with grpc.insecure_channel(client.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="stasis.v1.Stasis")
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(90)
def test_long_streams_never_take_the_threads_heartbeats_need(
    api: tuple[pb_grpc.StasisStub, StasisClient],
) -> None:
    stub, client = api
    quiet = pb.WatchEpisodesRequest(since_seq=1 << 60)  # no event to send: each stream just waits
    watches = [stub.WatchEpisodes(quiet) for _ in range(MAX_STREAMS)]
    try:

        def refused() -> bool:
            try:  # a stream that got a slot waits for events: its deadline ends it
                next(stub.WatchEpisodes(quiet, timeout=2))
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[no-any-return]
            return False

        wait_until(refused, 30, "the stream after the last slot to be refused")
        request = pb.StreamTrajectoriesRequest(since_seq=1 << 60)
        code, details = _status(lambda: next(stub.StreamTrajectories(request, timeout=10)))
        assert code == grpc.StatusCode.UNAVAILABLE and f"{MAX_STREAMS} streams are open" in details
        # The node agent's heartbeats keep landing while every slot is held.
        held_since = time.time()
        wait_until(lambda: client.nodes()[0].last_heartbeat > held_since + 1, 30, "a heartbeat")
        assert client.nodes()[0].state == "READY"
        for _ in range(API_WORKERS - MAX_STREAMS + 4):  # more short calls than spare threads, one by one
            assert client.get(client.submit({"image": "base", "command": ["true"]}).id).id
    finally:
        for w in watches:
            w.cancel()

    def served() -> bool:
        try:
            return next(stub.WatchEpisodes(pb.WatchEpisodesRequest(), timeout=5)) is not None
        except grpc.RpcError:
            return False

    wait_until(served, 30, "a stream to be served once slots are free")
