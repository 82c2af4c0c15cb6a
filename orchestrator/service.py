"""The orchestrator's gRPC face: the public Stasis API and the node registry. Errors map to status
codes here and nowhere else."""

from __future__ import annotations

import functools
import inspect
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc

from orchestrator.agents import SandboxView
from orchestrator.control import Control
from orchestrator.convert import (
    STATE_FROM_PB,
    STATE_TO_PB,
    branch_to_pb,
    episode_to_pb,
    event_to_pb,
    node_to_pb,
    snapshot_to_pb,
    spec_from_pb,
)
from orchestrator.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StasisError,
    TemporaryError,
)
from orchestrator.ledger import Ledger
from orchestrator.model import TERMINAL, Episode, EpisodeSpec, NodeRecord, NodeState, Reason
from orchestrator.scheduler import occupies_node
from orchestrator.store import StateStore
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from snapshots import SnapshotCorrupt, SnapshotError, SnapshotNotFound, SnapshotStore, StoreUnavailable

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[StasisError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Conflict, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (TemporaryError, grpc.StatusCode.UNAVAILABLE),
]

_SNAPSHOT_STATUS: list[tuple[type[SnapshotError], grpc.StatusCode]] = [
    (SnapshotNotFound, grpc.StatusCode.NOT_FOUND),
    (SnapshotCorrupt, grpc.StatusCode.DATA_LOSS),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def _abort(context: grpc.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, SnapshotError):
        code = next((c for kind, c in _SNAPSHOT_STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)
        context.abort(code, f"snapshot store: {exc}")
    code = next((c for kind, c in _STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)
    context.abort(code, str(exc))


def _rpc(method: F) -> F:
    """Map Stasis errors to status codes, for unary and server-streaming methods alike."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from method(self, request, context)
            except (StasisError, SnapshotError) as exc:
                _abort(context, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except (StasisError, SnapshotError) as exc:
            _abort(context, exc)

    return unary  # type: ignore[return-value]


def _required(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return value


class StasisService(pb_grpc.StasisServicer):
    def __init__(self, control: Control, store: StateStore, snapshots: SnapshotStore, ledger: Ledger) -> None:
        self.control = control
        self.store = store
        self.snapshots = snapshots
        self.ledger = ledger

    def _episode(self, episode_id: str) -> pb.Episode:
        return episode_to_pb(self.store.get(_required("episode_id", episode_id)), time.time())

    @_rpc
    def SubmitEpisode(self, request: pb.SubmitEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        spec = self._with_defaults(spec_from_pb(request.spec))
        self._check_image(spec.image)
        episode = self.store.submit(spec, request.request_id, self.control.pool_of_addresses)
        self.control.wake()
        return episode_to_pb(episode, time.time())

    def _with_defaults(self, spec: EpisodeSpec) -> EpisodeSpec:
        s = self.control.settings
        p = spec.preemption
        return replace(
            spec,
            preemption=replace(
                p,
                time_slice_s=p.time_slice_s or s.default_time_slice_s,
                priority=p.priority or s.default_priority,
            ),
        )

    def _check_image(self, image: str) -> None:
        nodes = [n for n in self.store.nodes() if n.state != NodeState.LOST]
        if nodes and not any(n.has_image(image) for n in nodes):
            known = sorted({name for n in nodes for names in n.images.values() for name in names})
            raise InvalidArgument(
                "spec.image", f"{image!r} is not cached on any node; known images: {', '.join(known)}"
            )

    @_rpc
    def GetEpisode(self, request: pb.GetEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        return self._episode(request.episode_id)

    @_rpc
    def ListEpisodes(
        self, request: pb.ListEpisodesRequest, context: grpc.ServicerContext
    ) -> pb.ListEpisodesResponse:
        states = [STATE_FROM_PB[s] for s in request.states if s in STATE_FROM_PB]
        episodes = self.store.query(states=states, node=request.node, labels=dict(request.labels))
        now = time.time()
        return pb.ListEpisodesResponse(episodes=[episode_to_pb(e, now) for e in episodes])

    @_rpc
    def WatchEpisodes(
        self, request: pb.WatchEpisodesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EpisodeEvent]:
        for episode_id in request.episode_ids:
            self.store.get(episode_id)
        since = request.since_seq
        while context.is_active() and not self.store.closed:
            events = self.store.events(since, request.episode_ids)
            for ev in events:
                yield event_to_pb(ev)
                since = ev.seq
            if not events:
                # The store notifies on every commit; the timeout only bounds how long a cancelled
                # stream lingers.
                self.store.wait_for_events(since, timeout=1.0)

    @_rpc
    def ListEvents(
        self, request: pb.ListEventsRequest, context: grpc.ServicerContext
    ) -> pb.ListEventsResponse:
        ids = [request.episode_id] if request.episode_id else []
        for episode_id in ids:
            self.store.get(episode_id)
        events = self.store.events(request.since_seq, ids, request.limit or 1000)
        return pb.ListEventsResponse(events=[event_to_pb(e) for e in events])

    def _idempotent(
        self, request_id: str, method: str, payload: dict[str, str], action: Callable[[], R]
    ) -> R | None:
        """Run action unless a request with this id already did (then None); a failed action
        leaves the id unused, so its retry fails the same way."""
        if request_id and self.store.known_request(request_id, method, payload) is not None:
            return None
        result = action()
        if request_id:
            self.store.remember_request(request_id, method, payload, next(iter(payload.values())))
        return result

    def _episode_change(
        self, request_id: str, method: str, payload: dict[str, str], action: Callable[[], Episode]
    ) -> pb.Episode:
        episode_id = _required("episode_id", payload["id"])
        self.store.get(episode_id)
        episode = self._idempotent(request_id, method, payload, action) or self.store.get(episode_id)
        return episode_to_pb(episode, time.time())

    @_rpc
    def CancelEpisode(self, request: pb.CancelEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id = request.episode_id
        return self._episode_change(
            request.request_id, "CancelEpisode", {"id": episode_id}, lambda: self.control.cancel(episode_id)
        )

    @_rpc
    def PreemptEpisode(self, request: pb.PreemptEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id, why = request.episode_id, request.reason or "preempted by user"
        return self._episode_change(
            request.request_id,
            "PreemptEpisode",
            {"id": episode_id, "reason": request.reason},
            lambda: self.control.checkpoint(episode_id, Reason.MANUAL, why),
        )

    @_rpc
    def ResumeEpisode(self, request: pb.ResumeEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id = request.episode_id
        return self._episode_change(
            request.request_id,
            "ResumeEpisode",
            {"id": episode_id, "node": request.node},
            lambda: self.control.resume(episode_id, request.node),
        )

    @_rpc
    def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        self.store.get(_required("episode_id", request.episode_id))
        records = self.store.snapshots(request.episode_id)
        return pb.ListSnapshotsResponse(
            snapshots=[snapshot_to_pb(r, self.snapshots.exists(r.id)) for r in records]
        )

    def _node(self, node: NodeRecord) -> pb.Node:
        on_node = [
            e for e in self.store.query(node=node.name) if e.state not in TERMINAL and occupies_node(e)
        ]
        return node_to_pb(node, on_node, self.control.last_heartbeat(node.name))

    @_rpc
    def ListNodes(self, request: pb.ListNodesRequest, context: grpc.ServicerContext) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=[self._node(n) for n in self.store.nodes()])

    @_rpc
    def ExportSnapshot(
        self, request: pb.ExportSnapshotRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ArchiveChunk]:
        snapshot_id = _required("snapshot_id", request.snapshot_id)
        if not self.snapshots.exists(snapshot_id):
            raise NotFound(f"snapshot {snapshot_id!r} does not exist (or retention has collected it)")
        with tempfile.TemporaryDirectory(prefix="export-") as tmp:
            archive = self.snapshots.export_archive(snapshot_id, Path(tmp) / f"{snapshot_id}.tar")
            with open(archive, "rb") as f:
                while block := f.read(1 << 20):
                    yield pb.ArchiveChunk(data=block)

    def _node_change(
        self, request_id: str, method: str, name: str, action: Callable[[str], NodeRecord]
    ) -> pb.Node:
        _required("node", name)
        self.store.node(name)
        node = self._idempotent(request_id, method, {"node": name}, lambda: action(name)) or self.store.node(
            name
        )
        return self._node(node)

    @_rpc
    def DrainNode(self, request: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        return self._node_change(request.request_id, "DrainNode", request.node, self.control.drain)

    @_rpc
    def UncordonNode(self, request: pb.UncordonNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        return self._node_change(request.request_id, "UncordonNode", request.node, self.control.uncordon)

    def _trajectory(self, episode: Episode, include_branches: bool, seq: int = 0) -> pb.Trajectory:
        branches = self.ledger.branches(episode.id)
        main = next((b for b in branches if b.id == 0), None)
        verification = self.ledger.verification(episode.id)
        return pb.Trajectory(
            episode_id=episode.id,
            state=STATE_TO_PB[episode.state],
            has_reward=episode.reward is not None,
            reward=episode.reward or 0.0,
            verifier_log=verification.log.decode(errors="replace") if verification else "",
            main=branch_to_pb(main) if main else pb.TrajectoryBranch(),
            branches=[branch_to_pb(b) for b in branches if b.id != 0] if include_branches else [],
            labels=episode.spec.labels,
            seq=seq,
        )

    @_rpc
    def GetTrajectory(self, request: pb.GetTrajectoryRequest, context: grpc.ServicerContext) -> pb.Trajectory:
        episode = self.store.get(_required("episode_id", request.episode_id))
        return self._trajectory(episode, request.include_branches)

    @_rpc
    def StreamTrajectories(
        self, request: pb.StreamTrajectoriesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Trajectory]:
        labels = dict(request.labels)
        since = request.since_seq
        while context.is_active() and not self.store.closed:
            events = self.store.events(since)
            for ev in events:
                since = ev.seq
                if ev.kind != "transition" or ev.to_state not in TERMINAL:
                    continue
                episode = self.store.get(ev.episode_id)
                if all(episode.spec.labels.get(k) == v for k, v in labels.items()):
                    yield self._trajectory(episode, request.include_branches, ev.seq)
            if not events:
                self.store.wait_for_events(since, timeout=1.0)


def _images(images: Any) -> dict[str, list[str]]:
    return {i.digest: sorted(i.names) for i in images}


class RegistryService(pb_grpc.NodeRegistryServicer):
    def __init__(self, control: Control) -> None:
        self.control = control

    @_rpc
    def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        info = request.info
        _required("info.name", info.name)
        _required("address", request.address)
        node = NodeRecord(
            name=info.name,
            address=request.address,
            state=NodeState.READY,
            backend=info.backend,
            slots=info.slots,
            memory_mb=info.memory_mb,
            images=_images(info.images),
            labels=dict(info.labels),
            registered_at=time.time(),
        )
        self.control.node_registered(node, [SandboxView.from_pb(s) for s in request.sandboxes])
        return pb.RegisterNodeResponse(heartbeat_interval_s=self.control.settings.heartbeat_interval_s)

    @_rpc
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        known = self.control.heartbeat(
            _required("node", request.node),
            [SandboxView.from_pb(s) for s in request.sandboxes],
            _images(request.images),
        )
        return pb.HeartbeatResponse(known=known)
