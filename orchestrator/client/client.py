"""A small typed client for trainer code and the CLI; no protobuf or gRPC types leak out.

from orchestrator import StasisClient
with StasisClient() as stasis:  # the current context of $STASIS_CONFIG or ~/.stasis/config
    episode = stasis.submit({"image": "base", "command": ["python3", "agent.py"]})
    for event in stasis.watch([episode.id]): ...
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from orchestrator.client.config import Context, config_path, load_context
from orchestrator.client.imagesource import is_registry_reference, push
from orchestrator.client.records import (
    EpisodeInfo,
    EventInfo,
    GroupInfo,
    NamedImageInfo,
    NodeInfo,
    PolicyVersionInfo,
    SnapshotInfo,
    TrajectoryInfo,
)
from orchestrator.client.specfile import spec_from_mapping
from orchestrator.domain import (
    Conflict,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PullStatus,
    StasisError,
    TemporaryError,
    Unauthenticated,
)
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc

DEFAULT_ADDR = "127.0.0.1:7070"
LIST_PAGE = 1000
"""Episodes per ListEpisodes page that `StasisClient.episodes` asks for."""
T = TypeVar("T")


FORK_TIMEOUT_S = 660.0
"""How long a ForkEpisode call may take: the orchestrator waits up to 600 s for a checkpoint."""


class StasisClient:
    """Talks to one orchestrator. Calls that change state carry a request id and are retried
    while the orchestrator is unreachable, so a retry never does the work twice.

    Its server and credential come from a context of the client config (see `client.config`),
    or from a `Context` given as such; `address` (or $STASIS_ADDR) overrides the context's
    server and keeps its credential.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        config: str | Path | None = None,
        context: str | Context | None = None,
        timeout_s: float = 30.0,
        retry_for_s: float = 30.0,
    ) -> None:
        ctx = context if isinstance(context, Context) else load_context(config_path(config), context)
        self.address = address or os.environ.get("STASIS_ADDR") or (ctx.server if ctx else "") or DEFAULT_ADDR
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
        ]
        if ctx is not None and ctx.certificate_authority is not None:
            try:
                ca = ctx.certificate_authority.read_bytes()
            except OSError as exc:
                raise InvalidArgument(
                    f"context {ctx.name}: certificate-authority",
                    f"cannot read {ctx.certificate_authority}: {exc.strerror}",
                ) from None
            credentials = grpc.ssl_channel_credentials(root_certificates=ca)
            if ctx.token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(ctx.token)
                )
            if ctx.tls_server_name:
                options.append(("grpc.ssl_target_name_override", ctx.tls_server_name))
            self._channel = grpc.secure_channel(self.address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = pb_grpc.StasisStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> StasisClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """The one place gRPC errors become Stasis errors."""
        try:
            yield
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                field_name, _, problem = details.partition(": ")
                raise InvalidArgument(field_name, problem) from None
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(details) from None
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise FailedPrecondition(details) from None
            if code == grpc.StatusCode.ALREADY_EXISTS:
                raise Conflict(details) from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated(f"Stasis at {self.address} refused the credential: {details}") from None
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise PermissionDenied(details) from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TemporaryError(
                    f"cannot reach Stasis at {self.address}: {details or code.name}"
                ) from None
            raise StasisError(f"{code.name}: {details}") from None

    def _call(
        self, method: Callable[..., T], request: Any, *, retried: bool = True, timeout_s: float = 0.0
    ) -> T:
        def once() -> T:
            with self._translated():
                return method(request, timeout=max(timeout_s, self.timeout_s))

        if not retried:
            return once()
        return retry(
            retry=retry_if_exception_type(TemporaryError),
            stop=stop_after_delay(self.retry_for_s),
            wait=wait_exponential(multiplier=0.2, max=3),
            reraise=True,
        )(once)()

    # -- episodes ---------------------------------------------------------------------------

    def submit(self, spec: EpisodeSpec | Mapping[str, Any], *, request_id: str | None = None) -> EpisodeInfo:
        """Submit an episode; a bad spec raises InvalidArgument naming the field."""
        if not isinstance(spec, EpisodeSpec):
            spec = spec_from_mapping(spec)
        request = pb.SubmitEpisodeRequest(spec=_encoded(spec), request_id=request_id or str(uuid.uuid4()))
        return _episode(self._call(self._stub.SubmitEpisode, request))

    def submit_many(self, specs: Sequence[EpisodeSpec | Mapping[str, Any]]) -> list[EpisodeInfo]:
        """Submit episodes in one durable commit, all or none (at most 1000). A bad spec raises
        InvalidArgument naming it, as in `submits[2].spec.image`; a retry submits nothing twice."""
        request = pb.SubmitEpisodesRequest()
        for i, spec in enumerate(specs):
            try:
                parsed = spec if isinstance(spec, EpisodeSpec) else spec_from_mapping(spec)
                request.submits.add(spec=_encoded(parsed), request_id=str(uuid.uuid4()))
            except InvalidArgument as exc:
                raise InvalidArgument(f"submits[{i}].{exc.field}", exc.problem) from None
        return [_episode(e) for e in self._call(self._stub.SubmitEpisodes, request).episodes]

    def submit_group(
        self,
        spec: EpisodeSpec | Mapping[str, Any],
        size: int,
        group_id: str,
        task_id: str,
        *,
        max_staleness: int | None = None,
        request_id: str | None = None,
    ) -> list[EpisodeInfo]:
        """Submit a GRPO group: `size` episodes of `spec`, its members 0 to size-1, in one commit.
        With `request_id`, member i carries `<request_id>/<i>`, so that a retry returns them; a
        group id taken by another group raises InvalidArgument naming the field that differs."""
        parsed = spec if isinstance(spec, EpisodeSpec) else spec_from_mapping(spec)
        encoded = _encoded(parsed)
        request = pb.SubmitEpisodesRequest(
            group=pb.EpisodeGroup(id=group_id, task_id=task_id, size=size, max_staleness=max_staleness)
        )
        for i in range(size):
            request.submits.add(
                spec=encoded, request_id=f"{request_id}/{i}" if request_id else str(uuid.uuid4())
            )
        return [_episode(e) for e in self._call(self._stub.SubmitEpisodes, request).episodes]

    def submit_from_snapshot(
        self,
        snapshot_id: str,
        count: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        group: tuple[str, str] | None = None,
        request_id: str | None = None,
    ) -> list[EpisodeInfo]:
        """Start `count` episodes from a committed snapshot of any episode (a set-up taken once),
        in one commit: each restores it as an episode of its own, with `labels` added. `group` is
        (group id, task id): the episodes are its members."""
        request = pb.SubmitEpisodesRequest()
        if group is not None:
            request.group.CopyFrom(pb.EpisodeGroup(id=group[0], task_id=group[1], size=count))
        for i in range(count):
            request.submits.add(
                spec=pb.EpisodeSpec(labels=dict(labels or {})), from_snapshot=snapshot_id,
                request_id=f"{request_id}/{i}" if request_id else str(uuid.uuid4()),
            )  # fmt: skip
        return [_episode(e) for e in self._call(self._stub.SubmitEpisodes, request).episodes]

    def fork(
        self,
        episode_id: str,
        count: int,
        *,
        snapshot_id: str = "",
        now: bool = False,
        stop: bool = False,
        labels: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> tuple[str, list[EpisodeInfo]]:
        """Fork an episode into `count` children: from `snapshot_id`, from a snapshot taken `now`
        (the episode runs on, or `stop`s there), else from its latest snapshot. Returns the
        snapshot forked and the children in fork index order."""
        request = pb.ForkEpisodeRequest(
            episode_id=episode_id, count=count, snapshot_id=snapshot_id, now=now, stop=stop,
            labels=dict(labels or {}), request_id=request_id or str(uuid.uuid4()),
        )  # fmt: skip
        # A fork taken now waits for its checkpoint (up to 10 minutes); a retry of it, under the
        # same request id, returns the first call's children.
        reply = self._call(self._stub.ForkEpisode, request, timeout_s=FORK_TIMEOUT_S)
        return reply.snapshot_id, [_episode(e) for e in reply.children]

    def groups(self, group_id: str = "") -> list[GroupInfo]:
        """Every GRPO group, oldest first, or the one named; where each stands."""
        reply = self._call(self._stub.ListGroups, pb.ListGroupsRequest(group_id=group_id))
        return [wire.decode(g, GroupInfo) for g in reply.groups]

    def get(self, episode_id: str) -> EpisodeInfo:
        return _episode(self._call(self._stub.GetEpisode, pb.GetEpisodeRequest(episode_id=episode_id)))

    def episodes(
        self, states: Collection[str] = (), node: str = "", labels: Mapping[str, str] | None = None
    ) -> list[EpisodeInfo]:
        """Every matching episode, in submission order, read a page of `LIST_PAGE` at a time."""
        request = pb.ListEpisodesRequest(
            states=[
                pb.EpisodeState.ValueType(wire.enum_number(pb.EpisodeState.DESCRIPTOR, _state(s)))
                for s in states
            ],
            node=node,
            labels=dict(labels or {}),
            page_size=LIST_PAGE,
        )
        found: list[EpisodeInfo] = []
        while True:
            page = self._call(self._stub.ListEpisodes, request)
            found += (_episode(e) for e in page.episodes)
            if not page.next_page_token:
                return found
            request.page_token = page.next_page_token

    def watch(self, episode_ids: Collection[str] = (), since_seq: int = 0) -> Iterator[EventInfo]:
        """Every state change and decision from since_seq on, then live, until the caller stops."""
        request = pb.WatchEpisodesRequest(episode_ids=list(episode_ids), since_seq=since_seq)
        with self._translated():
            for m in self._stub.WatchEpisodes(request):
                yield _event(m)

    def events(self, episode_id: str = "", since_seq: int = 0, limit: int = 1000) -> list[EventInfo]:
        request = pb.ListEventsRequest(episode_id=episode_id, since_seq=since_seq, limit=limit)
        return [_event(e) for e in self._call(self._stub.ListEvents, request).events]

    def cancel(self, episode_id: str) -> EpisodeInfo:
        request = pb.CancelEpisodeRequest(episode_id=episode_id, request_id=str(uuid.uuid4()))
        return _episode(self._call(self._stub.CancelEpisode, request))

    def preempt(self, episode_id: str, reason: str = "") -> EpisodeInfo:
        request = pb.PreemptEpisodeRequest(episode_id=episode_id, reason=reason, request_id=str(uuid.uuid4()))
        return _episode(self._call(self._stub.PreemptEpisode, request))

    def resume(self, episode_id: str, node: str = "") -> EpisodeInfo:
        request = pb.ResumeEpisodeRequest(episode_id=episode_id, node=node, request_id=str(uuid.uuid4()))
        return _episode(self._call(self._stub.ResumeEpisode, request))

    def wait(
        self,
        episode_id: str,
        states: Collection[str],
        timeout_s: float = 600,
        on_change: Callable[[EpisodeInfo], None] | None = None,
    ) -> EpisodeInfo:
        """Wait until the episode is in one of states, following its events as they happen.

        Raises TimeoutError with its last state, and FailedPrecondition at once if the episode
        ends in another state.
        """
        wanted = {s.upper() for s in states}
        deadline = time.monotonic() + timeout_s
        last = ""

        def check() -> EpisodeInfo | None:
            nonlocal last
            episode = self.get(episode_id)
            if episode.state != last:
                last = episode.state
                if on_change:
                    on_change(episode)
            if episode.state in wanted:
                return episode
            if episode.finished:
                raise FailedPrecondition(
                    f"episode {episode_id} ended as {episode.state} ({episode.reason}), not {'/'.join(sorted(wanted))}"
                )
            return None

        events = self.events(episode_id)
        since = events[-1].seq if events else 0
        while True:
            if (done := check()) is not None:
                return done
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"episode {episode_id} is still {last} after {timeout_s:.0f}s")
            request = pb.WatchEpisodesRequest(episode_ids=[episode_id], since_seq=since)
            try:
                for m in self._stub.WatchEpisodes(request, timeout=remaining):
                    since = m.seq
                    if m.kind == "transition" and (done := check()) is not None:
                        return done
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    with self._translated():
                        raise
                time.sleep(0.2)  # the orchestrator restarts, or the deadline passed: check again

    # -- trajectories -----------------------------------------------------------------------

    def trajectory(self, episode_id: str, include_branches: bool = False) -> TrajectoryInfo:
        request = pb.GetTrajectoryRequest(episode_id=episode_id, include_branches=include_branches)
        return _trajectory(self._call(self._stub.GetTrajectory, request))

    def stream_trajectories(
        self, labels: Mapping[str, str] | None = None, since_seq: int = 0, include_branches: bool = False
    ) -> Iterator[TrajectoryInfo]:
        """Finished episodes' trajectories as they finish; pass the last `seq` to resume."""
        request = pb.StreamTrajectoriesRequest(
            labels=dict(labels or {}), since_seq=since_seq, include_branches=include_branches
        )
        with self._translated():
            for m in self._stub.StreamTrajectories(request):
                yield _trajectory(m)

    def stream_trajectories_and_groups(
        self, labels: Mapping[str, str] | None = None, since_seq: int = 0, include_branches: bool = False
    ) -> Iterator[tuple[int, TrajectoryInfo | GroupInfo]]:
        """As `stream_trajectories`, with each GRPO group once it is decided (complete, or unable
        to complete), right after the trajectory of the member whose end decided it. Each item
        comes with the `seq` to resume after."""
        request = pb.StreamTrajectoriesRequest(
            labels=dict(labels or {}), since_seq=since_seq, include_branches=include_branches,
            include_groups=True,
        )  # fmt: skip
        with self._translated():
            for m in self._stub.StreamTrajectories(request):
                yield m.seq, wire.decode(m.group, GroupInfo) if m.HasField("group") else _trajectory(m)

    def publish_policy(self, version: int) -> PolicyVersionInfo:
        """Make `version` the current policy version (after a weight update). Versions only go
        up: an equal or lower one raises InvalidArgument naming `version`, and nothing changes."""
        request = pb.PublishPolicyRequest(version=version, request_id=str(uuid.uuid4()))
        return wire.decode(self._call(self._stub.PublishPolicy, request), PolicyVersionInfo)

    # -- snapshots and nodes ----------------------------------------------------------------

    def snapshots(self, episode_id: str) -> list[SnapshotInfo]:
        reply = self._call(self._stub.ListSnapshots, pb.ListSnapshotsRequest(episode_id=episode_id))
        return [wire.decode(s, SnapshotInfo) for s in reply.snapshots]

    def export_snapshot(self, snapshot_id: str, dest: Path) -> int:
        """Write a snapshot as a standard container checkpoint archive; returns its size in bytes."""
        size = 0
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            out = open(tmp, "wb")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:
            raise InvalidArgument("output", f"cannot write {dest}: {exc.strerror}") from None
        with self._translated(), out as f:
            for chunk in self._stub.ExportSnapshot(pb.ExportSnapshotRequest(snapshot_id=snapshot_id)):
                f.write(chunk.data)
                size += len(chunk.data)
        tmp.replace(dest)
        return size

    def nodes(self) -> list[NodeInfo]:
        return [_node(n) for n in self._call(self._stub.ListNodes, pb.ListNodesRequest()).nodes]

    def drain(self, node: str) -> NodeInfo:
        return _node(
            self._call(self._stub.DrainNode, pb.DrainNodeRequest(node=node, request_id=str(uuid.uuid4())))
        )

    def uncordon(self, node: str) -> NodeInfo:
        request = pb.UncordonNodeRequest(node=node, request_id=str(uuid.uuid4()))
        return _node(self._call(self._stub.UncordonNode, request))

    def logs(
        self, episode_id: str, run: int = 0, follow: bool = False, poll_s: float = 0.5
    ) -> Iterator[bytes]:
        """The harness's output across its runs (or run `run`), in order; with `follow`, also
        what it writes from now on, until the episode ends."""
        offset = 0
        while True:
            request = pb.GetEpisodeLogRequest(episode_id=episode_id, run=run, offset=offset)
            page = self._call(self._stub.GetEpisodeLog, request)
            if page.content:
                yield page.content
            offset = page.next_offset
            if page.content and not page.complete:
                continue  # more is there already
            if page.complete or not follow:
                return
            time.sleep(poll_s)

    # -- images -----------------------------------------------------------------------------

    def import_image(
        self,
        name: str,
        source: str,
        progress: Callable[[str], None] = lambda _: None,
        pulls: Callable[[PullStatus], None] = lambda _: None,
    ) -> NamedImageInfo:
        """Make SOURCE (see `imagesource`) available to every node as `name`: a local source is
        pushed to the cluster's import registry, then the orchestrator pins it and the nodes pull
        it. `progress` hears the push's lines; `pulls` hears each node's pull as it goes."""
        if is_registry_reference(source):
            reference = source
        else:
            registry = self._call(self._stub.ListImages, pb.ListImagesRequest()).import_registry
            if not registry:
                raise FailedPrecondition(
                    "this Stasis has no import registry (orchestrator --import-registry): push the "
                    "image to a registry the nodes reach and import it as host/repo:tag"
                )
            reference = push(source, registry, f"stasis/{name}", progress)
        progress(f"the nodes are pulling {reference}")
        request = pb.ImportNamedImageRequest(name=name, reference=reference, source=source)
        with self._translated():
            for m in self._stub.ImportImage(request, timeout=3600):
                if m.HasField("image"):
                    return wire.decode(m.image, NamedImageInfo)
                pulls(wire.decode(m, PullStatus))
        raise TemporaryError(f"Stasis at {self.address} ended the import of {name!r} without an image")

    def images(self) -> list[NamedImageInfo]:
        response = self._call(self._stub.ListImages, pb.ListImagesRequest())
        return [wire.decode(i, NamedImageInfo) for i in response.images]

    def remove_image(self, name: str) -> NamedImageInfo:
        return wire.decode(
            self._call(self._stub.RemoveImage, pb.RemoveImageRequest(name=name)), NamedImageInfo
        )


def _encoded(spec: EpisodeSpec) -> pb.EpisodeSpec:
    """The spec as sent, checked here first so that a value the wire cannot carry (a priority past
    int32, a string that is not Unicode text) is refused naming its field, not with a traceback."""
    spec.validate()
    try:
        return wire.encode(spec, pb.EpisodeSpec)
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidArgument("spec", f"cannot be sent: {exc}") from None


def _state(name: str) -> EpisodeState:
    try:
        return EpisodeState(name.upper())
    except ValueError:
        raise InvalidArgument(
            "states", f"{name!r} is not one of {', '.join(s.value for s in EpisodeState)}"
        ) from None


def _episode(m: pb.Episode) -> EpisodeInfo:
    return wire.decode(m, EpisodeInfo)


def _event(m: pb.EpisodeEvent) -> EventInfo:
    return wire.decode(m, EventInfo)


def _node(m: pb.Node) -> NodeInfo:
    return wire.decode(m, NodeInfo)


def _trajectory(m: pb.Trajectory) -> TrajectoryInfo:
    return wire.decode(m, TrajectoryInfo)
