"""Protobuf <-> domain, in one place: the service and the client are the only callers."""

from __future__ import annotations

import json

from orchestrator.ledger import Branch
from orchestrator.model import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    Event,
    Limits,
    NodeRecord,
    NodeState,
    Preemption,
    Resources,
    RewardSpec,
    SnapshotRecord,
)
from protos.stasis.v1 import agent_pb2 as apb
from protos.stasis.v1 import stasis_pb2 as pb

STATE_TO_PB = {s: getattr(pb, f"EPISODE_STATE_{s.value}") for s in EpisodeState}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}
NODE_STATE_TO_PB = {s: getattr(pb, f"NODE_STATE_{s.value}") for s in NodeState}
NODE_STATE_FROM_PB = {v: k for k, v in NODE_STATE_TO_PB.items()}


def spec_to_pb(spec: EpisodeSpec) -> pb.EpisodeSpec:
    msg = pb.EpisodeSpec(
        image=spec.image,
        command=list(spec.command),
        env=spec.env,
        files=spec.files,
        resources=apb.Resources(cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb),
        limits=pb.Limits(max_wall_s=spec.limits.max_wall_s),
        preemption=pb.Preemption(
            time_slice_s=spec.preemption.time_slice_s,
            priority=spec.preemption.priority,
            autosave_s=spec.preemption.autosave_s,
        ),
        labels=spec.labels,
    )
    if spec.reward is not None:
        msg.reward.CopyFrom(
            pb.RewardSpec(
                command=list(spec.reward.command),
                files=spec.reward.files,
                image=spec.reward.image,
                timeout_s=spec.reward.timeout_s,
            )
        )
    return msg


def spec_from_pb(msg: pb.EpisodeSpec) -> EpisodeSpec:
    """Build and validate; unset numbers take the documented defaults."""
    defaults = Resources()
    reward = None
    if msg.HasField("reward"):
        reward = RewardSpec(
            command=tuple(msg.reward.command),
            files=dict(msg.reward.files),
            image=msg.reward.image,
            timeout_s=msg.reward.timeout_s or 600.0,
        )
    return EpisodeSpec(
        image=msg.image,
        command=tuple(msg.command),
        env=dict(msg.env),
        files=dict(msg.files),
        resources=Resources(
            cpus=msg.resources.cpus or defaults.cpus, memory_mb=msg.resources.memory_mb or defaults.memory_mb
        ),
        limits=Limits(max_wall_s=msg.limits.max_wall_s),
        preemption=Preemption(
            time_slice_s=msg.preemption.time_slice_s,
            priority=msg.preemption.priority,
            autosave_s=msg.preemption.autosave_s,
        ),
        labels=dict(msg.labels),
        reward=reward,
    ).validate()


def episode_to_pb(e: Episode, now: float) -> pb.Episode:
    return pb.Episode(
        id=e.id,
        spec=spec_to_pb(e.spec),
        state=STATE_TO_PB[e.state],
        reason=e.reason,
        node=e.node,
        sandbox_id=e.sandbox_id,
        address=e.address,
        snapshots=e.snapshots,
        last_snapshot_id=e.last_snapshot_id,
        has_reward=e.reward is not None,
        reward=e.reward or 0.0,
        has_exit_code=e.exit_code is not None,
        exit_code=e.exit_code or 0,
        submitted_at=e.submitted_at,
        updated_at=e.updated_at,
        finished_at=e.finished_at,
        run_seconds=e.total_run_s(now),
        runs=e.runs,
        held=e.held,
        pinned_node=e.pinned_node,
    )


def event_to_pb(ev: Event) -> pb.EpisodeEvent:
    def state(s: str) -> int:
        return STATE_TO_PB[EpisodeState(s)] if s in EpisodeState.__members__ else 0

    return pb.EpisodeEvent(
        seq=ev.seq,
        episode_id=ev.episode_id,
        kind=ev.kind,
        from_state=state(ev.from_state),  # type: ignore[arg-type]
        to_state=state(ev.to_state),  # type: ignore[arg-type]
        reason=ev.reason,
        message=ev.message,
        node=ev.node,
        at=ev.at,
    )


def snapshot_to_pb(s: SnapshotRecord, available: bool) -> pb.Snapshot:
    return pb.Snapshot(
        id=s.id,
        episode_id=s.episode_id,
        parent_id=s.parent_id,
        sequence=s.sequence,
        node=s.node,
        reason=s.reason,
        created_at=s.created_at,
        logical_bytes=s.logical_bytes,
        stored_bytes=s.stored_bytes,
        new_bytes=s.new_bytes,
        trajectory_cursor=json.dumps(s.trajectory_cursor) if s.trajectory_cursor is not None else "",
        timings_ms=s.timings_ms,
        available=available,
    )


def node_to_pb(n: NodeRecord, episodes: list[Episode], last_heartbeat: float) -> pb.Node:
    return pb.Node(
        name=n.name,
        address=n.address,
        state=NODE_STATE_TO_PB[n.state],
        backend=n.backend,
        slots=n.slots,
        slots_used=len(episodes),
        memory_mb=n.memory_mb,
        memory_used_mb=sum(e.spec.resources.memory_mb for e in episodes),
        images=[apb.Image(digest=d, names=names) for d, names in sorted(n.images.items())],
        last_heartbeat=last_heartbeat,
        episodes=[e.id for e in episodes],
        labels=n.labels,
    )


def branch_to_pb(b: Branch) -> pb.TrajectoryBranch:
    return pb.TrajectoryBranch(
        id=b.id,
        abandoned=b.abandoned,
        token_ids=b.token_ids,
        logprobs=b.logprobs,
        loss_mask=b.loss_mask,
        policy_versions=[t.policy_version for t in b.turns],
        turns=[
            pb.Turn(
                id=t.id,
                index=i,
                branch=t.branch,
                replayed=t.replays > 0,
                replays=t.replays,
                abandoned=t.abandoned,
                token_ids=t.token_ids,
                logprobs=t.logprobs,
                policy_version=t.policy_version,
                parent_id=t.parent_id or 0,
                run=t.run,
                created_at=t.created_at,
                prompt_tokens=len(t.prompt_token_ids),
            )
            for i, t in enumerate(b.turns)
        ],
    )
