"""The public Stasis API: protobuf in, domain calls, protobuf out. Specs are validated here, once,
as they enter the system; errors map to status codes in `status`."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import grpc

from orchestrator.api import forking
from orchestrator.api.messages import (
    branch_to_pb,
    episode_to_pb,
    group_to_pb,
    node_to_pb,
    page_start,
    page_token,
    snapshot_to_pb,
)
from orchestrator.api.status import required, rpc
from orchestrator.api.streams import StreamSlots, bounded
from orchestrator.control import Control
from orchestrator.domain import (
    TERMINAL,
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    Group,
    GroupOutcome,
    ImageRecord,
    InvalidArgument,
    NodeRecord,
    NotFound,
    Origin,
    ids,
)
from orchestrator.state import StateStore
from orchestrator.trajectory import Ledger, samples
from protos.shared import wire
from protos.shared.relay import relay
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from snapshots import SnapshotStore

R = TypeVar("R")
_STATE = pb.EpisodeState.DESCRIPTOR


MAX_SUBMITS = 1000
"""Episodes one SubmitEpisodes call may carry: a few rollout groups, and a commit that stays short."""
MAX_PAGE = 10_000
"""Episodes one ListEpisodes page holds at most: a few MB of answer, however large the specs."""
DEFAULT_EVENTS = 1000
"""Events one ListEvents call returns when it names no limit."""
MAX_EVENTS = 10000
"""The most one ListEvents call returns; a reader pages on with since_seq."""


class StasisService(pb_grpc.StasisServicer):
    def __init__(
        self,
        control: Control,
        store: StateStore,
        snapshots: SnapshotStore,
        ledger: Ledger,
        import_registry: str = "",
        streams: StreamSlots | None = None,
    ) -> None:
        self.import_registry = import_registry
        self.streams = streams or StreamSlots()
        self._claims = threading.Lock()
        """Held from checking a request id to remembering it (the commands under it are quick)."""
        self.control = control
        self.store = store
        self.snapshots = snapshots
        self.ledger = ledger

    def _episode(self, episode_id: str) -> pb.Episode:
        return episode_to_pb(self.store.episodes.get(required("episode_id", episode_id)), time.time())

    @rpc
    def SubmitEpisode(self, request: pb.SubmitEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episodes = self._submit([request], None)
        return episode_to_pb(episodes[0], time.time())

    @rpc
    def SubmitEpisodes(
        self, request: pb.SubmitEpisodesRequest, context: grpc.ServicerContext
    ) -> pb.SubmitEpisodesResponse:
        if not request.submits:
            raise InvalidArgument("submits", "is empty")
        group = self._group(request)
        if len(request.submits) > MAX_SUBMITS:
            raise InvalidArgument("submits", f"has {len(request.submits)} entries; at most {MAX_SUBMITS}")
        episodes = self._submit(request.submits, group, "submits[{}].")
        now = time.time()
        return pb.SubmitEpisodesResponse(episodes=[episode_to_pb(e, now) for e in episodes])

    def _submit(
        self, submits: Sequence[pb.SubmitEpisodeRequest], group: Group | None, where: str = ""
    ) -> list[Episode]:
        """Accept the submits, all or none: fresh ones, and those that start from a snapshot
        (`forking`), the children of one snapshot numbered in the order given."""
        specs, origins, pinned = [], list[Origin | None](), dict[str, str]()
        children: dict[str, int] = {}
        for i, submit in enumerate(submits):
            try:
                if submit.from_snapshot:
                    field = where.format(i) + "from_snapshot"
                    record, parent = self.control.forks.source(submit.from_snapshot, field)
                    self.control.forks.check_restorable(record, field)
                    spec = forking.spec_from_snapshot(
                        submit, record, parent, lambda image, field: self._pin(image, field, pinned)
                    )
                    spec = self._pin_images(spec, pinned)
                    index = children[record.id] = children.get(record.id, -1) + 1
                    origins.append(Origin(record.id, parent, index))
                else:
                    spec = self._accepted(submit, pinned)
                    origins.append(None)
            except InvalidArgument as exc:
                raise InvalidArgument(where.format(i) + exc.field, exc.problem) from None
            specs.append((spec, submit.request_id))
        episodes = self.store.episodes.submit_many(specs, self.control.pool_of_addresses, group, origins)
        self.control.wake()
        return episodes

    @rpc
    def ForkEpisode(
        self, request: pb.ForkEpisodeRequest, context: grpc.ServicerContext
    ) -> pb.ForkEpisodeResponse:
        group = wire.decode(request.group, Group).validate() if request.HasField("group") else None
        source, children = self.control.forks.fork(
            required("episode_id", request.episode_id), request.count, snapshot_id=request.snapshot_id,
            now=request.now, stop=request.stop, labels=dict(request.labels), group=group,
            request_id=request.request_id,
        )  # fmt: skip
        now = time.time()
        return pb.ForkEpisodeResponse(
            snapshot_id=source.id,
            children=[episode_to_pb(e, now) for e in children],
        )

    def _group(self, request: pb.SubmitEpisodesRequest) -> Group | None:
        """The request's group, validated; its submits must be all N members at once."""
        if not request.HasField("group"):
            return None
        group = wire.decode(request.group, Group).validate()
        if len(request.submits) != group.size:
            raise InvalidArgument(
                "group.size", f"is {group.size}, but the request has {len(request.submits)} submits;"
                " a group's members are submitted together"
            )  # fmt: skip
        return group

    def _accepted(self, request: pb.SubmitEpisodeRequest, pinned: dict[str, str]) -> EpisodeSpec:
        """The request's spec, validated, with the cluster's defaults and its images pinned
        (`_pin_images`)."""
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        if request.spec.entrypoint and not request.spec.has_entrypoint:
            # Else the decoder would read it as unset, and the image's own would run.
            raise InvalidArgument(
                "spec.entrypoint", "is given, but has_entrypoint is false; set it to replace the image's"
            )
        return self._pin_images(
            self._with_defaults(wire.decode(request.spec, EpisodeSpec).validate()), pinned
        )

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

    def _pin_images(self, spec: EpisodeSpec, pinned: dict[str, str]) -> EpisodeSpec:
        """The spec with its images pinned (see `control.images`): every run uses the same bytes.
        `pinned` holds the pins of the call so far: a batch pins each image once, so a rollout
        group runs one image even if its tag moves meanwhile, and asks a node once, not per spec."""

        reward = spec.reward
        if reward is not None and reward.image:
            reward = replace(reward, image=self._pin(reward.image, "spec.reward.image", pinned))
        return replace(spec, image=self._pin(spec.image, "spec.image", pinned), reward=reward)

    def _pin(self, image: str, field: str, pinned: dict[str, str]) -> str:
        if image not in pinned:
            pinned[image] = self.control.images.pin(image, field)
        return pinned[image]

    @rpc
    def GetEpisode(self, request: pb.GetEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        return self._episode(request.episode_id)

    @rpc
    def ListEpisodes(
        self, request: pb.ListEpisodesRequest, context: grpc.ServicerContext
    ) -> pb.ListEpisodesResponse:
        states = [EpisodeState[n] for s in request.states if (n := wire.enum_name(_STATE, s))]
        if request.page_size < 0:
            raise InvalidArgument("page_size", f"{request.page_size} is negative")
        size, labels = min(request.page_size, MAX_PAGE), dict(request.labels)
        after = page_start(request.page_token) if request.page_token else None
        if not size:
            page = self.store.episodes.query(states=states, node=request.node, labels=labels, after=after)
        else:
            # The labels are matched here, so that the next page starts after the last episode read.
            page, more = [], True
            while more and len(page) < size:
                read = self.store.episodes.query(states=states, node=request.node, after=after, limit=size)
                more = len(read) == size
                for e in read:
                    after = (e.submitted_at, e.id)
                    if e.has_labels(labels):
                        page.append(e)
                        if len(page) == size:
                            break
        now = time.time()
        return pb.ListEpisodesResponse(
            episodes=[episode_to_pb(e, now) for e in page],
            next_page_token=page_token(after) if size and len(page) == size else "",
        )

    @rpc
    @bounded
    def WatchEpisodes(
        self, request: pb.WatchEpisodesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EpisodeEvent]:
        for episode_id in request.episode_ids:
            self.store.episodes.get(episode_id)
        since = request.since_seq
        while context.is_active() and not self.store.closed:
            events = self.store.events.read(since, request.episode_ids)
            for ev in events:
                yield wire.encode(ev, pb.EpisodeEvent)
                since = ev.seq
            if not events:
                # The store notifies on every commit; the timeout only bounds how long a cancelled
                # stream lingers.
                self.store.events.wait(since, timeout=1.0)

    @rpc
    def ListEvents(
        self, request: pb.ListEventsRequest, context: grpc.ServicerContext
    ) -> pb.ListEventsResponse:
        if not 0 <= request.limit <= MAX_EVENTS:
            raise InvalidArgument(
                "limit", f"{request.limit} must be between 0 ({DEFAULT_EVENTS}) and {MAX_EVENTS}"
            )
        ids = [request.episode_id] if request.episode_id else []
        for episode_id in ids:
            self.store.episodes.get(episode_id)
        events = self.store.events.read(request.since_seq, ids, request.limit or DEFAULT_EVENTS)
        return pb.ListEventsResponse(events=[wire.encode(e, pb.EpisodeEvent) for e in events])

    def _idempotent(
        self, request_id: str, method: str, payload: dict[str, str], action: Callable[[], R]
    ) -> R | None:
        """Run action unless a request with this id already did (then None); a failed action
        leaves the id unused, so its retry fails the same way. The id is claimed with its
        action: concurrent retries wait, then find it done."""
        if not request_id:
            return action()
        with self._claims:
            if self.store.requests.known(request_id, method, payload) is not None:
                return None
            result = action()
            self.store.requests.remember(request_id, method, payload, next(iter(payload.values())))
            return result

    def _episode_change(
        self, request_id: str, method: str, payload: dict[str, str], action: Callable[[], Episode]
    ) -> pb.Episode:
        episode_id = required("episode_id", payload["id"])
        self.store.episodes.get(episode_id)
        episode = self._idempotent(request_id, method, payload, action) or self.store.episodes.get(episode_id)
        return episode_to_pb(episode, time.time())

    @rpc
    def CancelEpisode(self, request: pb.CancelEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id = request.episode_id
        return self._episode_change(
            request.request_id,
            "CancelEpisode",
            {"id": episode_id},
            lambda: self.control.commands.cancel(episode_id),
        )

    @rpc
    def PreemptEpisode(self, request: pb.PreemptEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id, why = request.episode_id, request.reason or "preempted by user"
        return self._episode_change(
            request.request_id,
            "PreemptEpisode",
            {"id": episode_id, "reason": request.reason},
            lambda: self.control.commands.preempt(episode_id, why),
        )

    @rpc
    def ResumeEpisode(self, request: pb.ResumeEpisodeRequest, context: grpc.ServicerContext) -> pb.Episode:
        episode_id = request.episode_id
        return self._episode_change(
            request.request_id,
            "ResumeEpisode",
            {"id": episode_id, "node": request.node},
            lambda: self.control.commands.resume(episode_id, request.node),
        )

    @rpc
    def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        self.store.episodes.get(required("episode_id", request.episode_id))
        records = self.store.snapshots.of(request.episode_id)
        forks = self.store.snapshots.forks([r.id for r in records])
        return pb.ListSnapshotsResponse(
            snapshots=[snapshot_to_pb(r, self.snapshots.exists(r.id), forks.get(r.id)) for r in records]
        )

    def _node(self, node: NodeRecord) -> pb.Node:
        on_node = self.store.episodes.on_nodes(node.name)
        return node_to_pb(node, on_node, self.control.members.last_heartbeat(node.name))

    @rpc
    def ListNodes(self, request: pb.ListNodesRequest, context: grpc.ServicerContext) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=[self._node(n) for n in self.store.nodes.all()])

    def _named_image(self, image: ImageRecord) -> pb.NamedImage:
        return wire.encode(image, pb.NamedImage, nodes=self.control.images.caching(image))

    @rpc
    @bounded
    def ImportImage(
        self, request: pb.ImportNamedImageRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ImportProgress]:
        name, reference = required("name", request.name), required("reference", request.reference)
        image = yield from relay(
            lambda report: self.control.images.import_image(
                name, reference, request.source, lambda p: report(wire.encode(p, pb.ImportProgress))
            ),
            name="import",
        )
        yield pb.ImportProgress(phase="imported", image=self._named_image(image))

    @rpc
    def ListImages(
        self, request: pb.ListImagesRequest, context: grpc.ServicerContext
    ) -> pb.ListImagesResponse:
        return pb.ListImagesResponse(
            images=[self._named_image(i) for i in self.store.images.all()],
            import_registry=self.import_registry,
        )

    @rpc
    def RemoveImage(self, request: pb.RemoveImageRequest, context: grpc.ServicerContext) -> pb.NamedImage:
        return self._named_image(self.control.images.remove(required("name", request.name)))

    @rpc
    def GetEpisodeLog(self, request: pb.GetEpisodeLogRequest, context: grpc.ServicerContext) -> pb.EpisodeLog:
        page = self.control.logs.page(required("episode_id", request.episode_id), request.run, request.offset)
        return wire.encode(page, pb.EpisodeLog)

    @rpc
    @bounded
    def ExportSnapshot(
        self, request: pb.ExportSnapshotRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ArchiveChunk]:
        snapshot_id = required("snapshot_id", request.snapshot_id)
        if not self.snapshots.exists(snapshot_id):
            raise NotFound(f"snapshot {snapshot_id!r} does not exist (or retention has collected it)")
        # An archive is restored elsewhere as it is: only the manifest recorded is exported.
        parsed = ids.SnapshotId.parse(snapshot_id)
        recorded = {r.id: r for r in self.store.snapshots.of(parsed.episode_id)} if parsed else {}
        digest = recorded[snapshot_id].manifest_digest if snapshot_id in recorded else ""
        if not digest:
            raise FailedPrecondition(
                f"snapshot {snapshot_id!r} has no recorded manifest digest, so nothing vouches "
                "for what the store holds of it; it is not exported"
            )
        with tempfile.TemporaryDirectory(prefix="export-") as tmp:
            archive = self.snapshots.export_archive(snapshot_id, Path(tmp) / f"{snapshot_id}.tar", digest)
            with open(archive, "rb") as f:
                while block := f.read(1 << 20):
                    yield pb.ArchiveChunk(data=block)

    def _node_change(
        self, request_id: str, method: str, name: str, action: Callable[[str], NodeRecord]
    ) -> pb.Node:
        required("node", name)
        self.store.nodes.get(name)
        node = self._idempotent(
            request_id, method, {"node": name}, lambda: action(name)
        ) or self.store.nodes.get(name)
        return self._node(node)

    @rpc
    def DrainNode(self, request: pb.DrainNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        return self._node_change(request.request_id, "DrainNode", request.node, self.control.commands.drain)

    @rpc
    def UncordonNode(self, request: pb.UncordonNodeRequest, context: grpc.ServicerContext) -> pb.Node:
        return self._node_change(
            request.request_id, "UncordonNode", request.node, self.control.commands.uncordon
        )

    def _trajectory(self, episode: Episode, include_branches: bool, seq: int = 0) -> pb.Trajectory:
        branches = self.ledger.branches(episode.id)
        main = next((b for b in branches if b.id == 0), None)
        turns = [t for b in branches for t in b.turns]
        verification = self.ledger.verifications.get(episode.id)
        return wire.encode(
            episode, pb.Trajectory,
            episode_id=episode.id,
            verifier_log=verification.log.decode(errors="replace") if verification else "",
            reward_metrics=verification.metrics if verification else {},
            main=branch_to_pb(main) if main else pb.TrajectoryBranch(),
            branches=[branch_to_pb(b) for b in branches if b.id != 0] if include_branches else [],
            labels=episode.spec.labels,
            seq=seq,
            samples=samples(turns, self.ledger.policy.published()),
            prompt_breaks=sum(t.prefix_exact is False for t in turns if not t.abandoned),
        )  # fmt: skip

    @rpc
    def GetTrajectory(self, request: pb.GetTrajectoryRequest, context: grpc.ServicerContext) -> pb.Trajectory:
        episode = self.store.episodes.get(required("episode_id", request.episode_id))
        return self._trajectory(episode, request.include_branches)

    @rpc
    def PublishPolicy(
        self, request: pb.PublishPolicyRequest, context: grpc.ServicerContext
    ) -> pb.PolicyVersion:
        version = request.version
        published = self._idempotent(
            request.request_id,
            "PublishPolicy",
            {"version": str(version)},
            lambda: self.ledger.policy.publish(version),
        )
        return wire.encode(published or self.ledger.policy.current(), pb.PolicyVersion)

    @rpc
    @bounded
    def StreamTrajectories(
        self, request: pb.StreamTrajectoriesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Trajectory]:
        labels = dict(request.labels)
        since = request.since_seq
        while context.is_active() and not self.store.closed:
            events = self.store.events.read(since)
            for ev in events:
                since = ev.seq
                if ev.kind != "transition" or ev.to_state not in TERMINAL:
                    continue
                episode = self.store.episodes.get(ev.episode_id)
                if all(episode.spec.labels.get(k) == v for k, v in labels.items()):
                    yield self._trajectory(episode, request.include_branches, ev.seq)
                    if request.include_groups and episode.group_id:
                        decided = self._group_decided_by(episode)
                        if decided is not None:
                            yield pb.Trajectory(seq=ev.seq, group=group_to_pb(decided))
            if not events:
                self.store.events.wait(since, timeout=1.0)

    def _group_decided_by(self, episode: Episode) -> GroupOutcome | None:
        """The group of `episode` if its end decided the group's outcome (`decided_by`). Each
        member ends once, so a stream yields each group's item once, whenever it began reading."""
        group = self.store.groups.get(episode.group_id)
        outcome = GroupOutcome.of(group, self.store.groups.members(group.id))
        decided = outcome.decided_by
        return outcome if decided is not None and decided.episode_id == episode.id else None

    @rpc
    def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.ServicerContext
    ) -> pb.ListGroupsResponse:
        groups = [self.store.groups.get(request.group_id)] if request.group_id else self.store.groups.all()
        return pb.ListGroupsResponse(
            groups=[group_to_pb(GroupOutcome.of(g, self.store.groups.members(g.id))) for g in groups]
        )
