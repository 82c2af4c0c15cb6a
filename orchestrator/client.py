"""A small typed client for trainer code and the CLI; no protobuf or gRPC types leak out.

from orchestrator import StasisClient
with StasisClient("127.0.0.1:7070") as stasis:
    episode = stasis.submit({"image": "base", "command": ["python3", "agent.py"]})
    for event in stasis.watch([episode.id]): ...
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from orchestrator.convert import NODE_STATE_FROM_PB, STATE_FROM_PB, STATE_TO_PB, spec_to_pb
from orchestrator.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StasisError,
    TemporaryError,
)
from orchestrator.model import EpisodeSpec, EpisodeState, Event
from orchestrator.specfile import spec_from_mapping
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc

DEFAULT_ADDR = "127.0.0.1:7070"
T = TypeVar("T")


@dataclass(frozen=True)
class EpisodeInfo:
    id: str
    state: str
    reason: str
    node: str
    image: str
    priority: int
    labels: dict[str, str]
    snapshots: int
    last_snapshot_id: str
    reward: float | None
    exit_code: int | None
    address: str
    runs: int
    run_seconds: float
    held: bool
    pinned_node: str
    submitted_at: float
    updated_at: float
    finished_at: float

    @property
    def finished(self) -> bool:
        return EpisodeState(self.state).terminal

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


EventInfo = Event
"""A state change or scheduling decision, as the orchestrator records it."""


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    episode_id: str
    parent: str
    sequence: int
    node: str
    reason: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    available: bool
    trajectory_cursor: Any
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    address: str
    backend: str
    slots: int
    slots_used: int
    memory_mb: int
    memory_used_mb: int
    images: dict[str, list[str]]
    episodes: list[str]
    last_heartbeat: float
    labels: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TurnInfo:
    id: int
    index: int
    branch: int
    replayed: bool
    abandoned: bool
    token_ids: list[int]
    logprobs: list[float]
    policy_version: str
    parent_id: int
    run: int


@dataclass(frozen=True)
class BranchInfo:
    id: int
    abandoned: bool
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    policy_versions: list[str]
    turns: list[TurnInfo]


@dataclass(frozen=True)
class TrajectoryInfo:
    episode_id: str
    state: str
    reward: float | None
    verifier_log: str
    main: BranchInfo
    branches: list[BranchInfo]
    labels: dict[str, str]
    seq: int

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON: every turn of every branch shown, main first, plus the reward."""
        turns = [t for b in [self.main, *self.branches] for t in b.turns]
        return {
            "episode_id": self.episode_id,
            "state": self.state,
            "reward": self.reward,
            "turns": [dict(t.__dict__) for t in turns],
            "main": {k: v for k, v in self.main.__dict__.items() if k != "turns"},
            "verifier_log": self.verifier_log,
        }


def _branch(b: pb.TrajectoryBranch) -> BranchInfo:
    return BranchInfo(
        id=b.id,
        abandoned=b.abandoned,
        token_ids=list(b.token_ids),
        logprobs=list(b.logprobs),
        loss_mask=list(b.loss_mask),
        policy_versions=list(b.policy_versions),
        turns=[
            TurnInfo(
                id=t.id,
                index=t.index,
                branch=t.branch,
                replayed=t.replayed,
                abandoned=t.abandoned,
                token_ids=list(t.token_ids),
                logprobs=list(t.logprobs),
                policy_version=t.policy_version,
                parent_id=t.parent_id,
                run=t.run,
            )
            for t in b.turns
        ],
    )


def _trajectory(m: pb.Trajectory) -> TrajectoryInfo:
    return TrajectoryInfo(
        episode_id=m.episode_id,
        state=_state_name(m.state),
        reward=m.reward if m.has_reward else None,
        verifier_log=m.verifier_log,
        main=_branch(m.main),
        branches=[_branch(b) for b in m.branches],
        labels=dict(m.labels),
        seq=m.seq,
    )


def _state_name(value: int) -> str:
    state = STATE_FROM_PB.get(value)
    return str(state) if state is not None else ""


def _episode(m: pb.Episode) -> EpisodeInfo:
    return EpisodeInfo(
        id=m.id,
        state=_state_name(m.state),
        reason=m.reason,
        node=m.node,
        image=m.spec.image,
        priority=m.spec.preemption.priority,
        labels=dict(m.spec.labels),
        snapshots=m.snapshots,
        last_snapshot_id=m.last_snapshot_id,
        reward=m.reward if m.has_reward else None,
        exit_code=m.exit_code if m.has_exit_code else None,
        address=m.address,
        runs=m.runs,
        run_seconds=m.run_seconds,
        held=m.held,
        pinned_node=m.pinned_node,
        submitted_at=m.submitted_at,
        updated_at=m.updated_at,
        finished_at=m.finished_at,
    )


def _event(m: pb.EpisodeEvent) -> EventInfo:
    return Event(
        seq=m.seq,
        episode_id=m.episode_id,
        kind=m.kind,
        from_state=_state_name(m.from_state),
        to_state=_state_name(m.to_state),
        reason=m.reason,
        message=m.message,
        node=m.node,
        at=m.at,
    )


class StasisClient:
    """Talks to one orchestrator. Calls that change state carry a request id and are retried
    while the orchestrator is unreachable, so a retry never does the work twice."""

    def __init__(
        self, address: str | None = None, *, timeout_s: float = 30.0, retry_for_s: float = 30.0
    ) -> None:
        self.address = address or os.environ.get("STASIS_ADDR") or DEFAULT_ADDR
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self._channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_send_message_length", 64 << 20)]
        )
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
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TemporaryError(
                    f"cannot reach Stasis at {self.address}: {details or code.name}"
                ) from None
            raise StasisError(f"{code.name}: {details}") from None

    def _call(self, method: Callable[..., T], request: Any, *, retried: bool = True) -> T:
        def once() -> T:
            with self._translated():
                return method(request, timeout=self.timeout_s)

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
        """Submit an episode; the spec is validated here first, so errors name the field."""
        if not isinstance(spec, EpisodeSpec):
            spec = spec_from_mapping(spec)
        request = pb.SubmitEpisodeRequest(
            spec=spec_to_pb(spec.validate()), request_id=request_id or str(uuid.uuid4())
        )
        return _episode(self._call(self._stub.SubmitEpisode, request))

    def get(self, episode_id: str) -> EpisodeInfo:
        return _episode(self._call(self._stub.GetEpisode, pb.GetEpisodeRequest(episode_id=episode_id)))

    def episodes(
        self, states: Collection[str] = (), node: str = "", labels: Mapping[str, str] | None = None
    ) -> list[EpisodeInfo]:
        request = pb.ListEpisodesRequest(
            states=[STATE_TO_PB[EpisodeState(s.upper())] for s in states],
            node=node,
            labels=dict(labels or {}),
        )
        return [_episode(e) for e in self._call(self._stub.ListEpisodes, request).episodes]

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

    # -- snapshots and nodes ----------------------------------------------------------------

    def snapshots(self, episode_id: str) -> list[SnapshotInfo]:
        reply = self._call(self._stub.ListSnapshots, pb.ListSnapshotsRequest(episode_id=episode_id))
        return [
            SnapshotInfo(
                id=s.id,
                episode_id=s.episode_id,
                parent=s.parent_id,
                sequence=s.sequence,
                node=s.node,
                reason=s.reason,
                created_at=s.created_at,
                logical_bytes=s.logical_bytes,
                stored_bytes=s.stored_bytes,
                new_bytes=s.new_bytes,
                available=s.available,
                trajectory_cursor=json.loads(s.trajectory_cursor) if s.trajectory_cursor else None,
                timings_ms=dict(s.timings_ms),
            )
            for s in reply.snapshots
        ]

    def export_snapshot(self, snapshot_id: str, dest: Path) -> int:
        """Write a snapshot as a standard container checkpoint archive; returns its size in bytes."""
        size = 0
        tmp = dest.with_name(f".{dest.name}.partial")
        with self._translated(), open(tmp, "wb") as f:
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


def _node(n: pb.Node) -> NodeInfo:
    state = NODE_STATE_FROM_PB.get(n.state)
    return NodeInfo(
        name=n.name,
        state=str(state) if state is not None else "",
        address=n.address,
        backend=n.backend,
        slots=n.slots,
        slots_used=n.slots_used,
        memory_mb=n.memory_mb,
        memory_used_mb=n.memory_used_mb,
        images={i.digest: list(i.names) for i in n.images},
        episodes=list(n.episodes),
        last_heartbeat=n.last_heartbeat,
        labels=dict(n.labels),
    )
