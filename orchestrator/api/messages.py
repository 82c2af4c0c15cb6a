"""The public API's answers: domain records as the protobuf messages `StasisService` returns
(through the generic codec, with what each message computes beside its record), and the page
tokens of ListEpisodes."""

from __future__ import annotations

import base64
import json

from orchestrator.domain import (
    Episode,
    GroupOutcome,
    InvalidArgument,
    NodeRecord,
    SnapshotRecord,
    may_read_hidden,
)
from orchestrator.trajectory import Branch, Turn
from protos.shared import wire
from protos.stasis.v1 import agent_pb2 as apb
from protos.stasis.v1 import stasis_pb2 as pb


def episode_to_pb(e: Episode, now: float) -> pb.Episode:
    """The episode as every API answer carries it: without its gateway key, and without the
    contents of its hidden reward files unless an operator asks (a harness that could read them
    would grade itself)."""
    msg = wire.encode(e, pb.Episode, run_seconds=e.total_run_s(now))
    if msg.spec.HasField("reward") and not may_read_hidden():
        msg.spec.reward.files.clear()
    return msg


def snapshot_to_pb(s: SnapshotRecord, available: bool, forks: list[str] | None = None) -> pb.Snapshot:
    """The snapshot's record, whether the store still holds it, and the episodes forked from it."""
    return wire.encode(s, pb.Snapshot, available=available, forks=forks or [])


def node_to_pb(n: NodeRecord, episodes: list[Episode], last_heartbeat: float) -> pb.Node:
    return wire.encode(
        n, pb.Node,
        slots_used=len(episodes),
        memory_used_mb=sum(e.spec.resources.memory_mb for e in episodes),
        disk_used_mb=sum(e.spec.resources.disk_mb for e in episodes),
        images=[apb.Image(digest=d, names=names) for d, names in sorted(n.images.items())],
        last_heartbeat=last_heartbeat,
        episodes=[e.id for e in episodes],
    )  # fmt: skip


def turn_to_pb(t: Turn, index: int) -> pb.Turn:
    return wire.encode(
        t, pb.Turn,
        index=index,
        replayed=t.replays > 0,
        prompt_tokens=len(t.prompt_token_ids),
        prefix_exact=t.prefix_exact is True,
        prefix_checked=t.prefix_exact is not None,
        common_prefix=t.lineage.common_prefix,
        break_reason=t.lineage.break_reason,
    )  # fmt: skip


def branch_to_pb(b: Branch) -> pb.TrajectoryBranch:
    turns = [turn_to_pb(t, i) for i, t in enumerate(b.turns)]
    return wire.encode(
        b, pb.TrajectoryBranch, turns=turns, policy_versions=[t.policy_version for t in b.turns]
    )


def group_to_pb(outcome: GroupOutcome) -> pb.GroupResult:
    broken = outcome.broken_by
    return wire.encode(
        outcome.group, pb.GroupResult,
        final=outcome.final,
        complete=outcome.complete,
        broken=broken is not None,
        broken_by=broken,
        problem=outcome.problem,
        members=outcome.members,
    )  # fmt: skip


def page_token(after: tuple[float, str] | None) -> str:
    """Where a ListEpisodes page ended (the last episode read: its submitted_at and id)."""
    return base64.urlsafe_b64encode(json.dumps(after).encode()).decode()


def page_start(token: str) -> tuple[float, str]:
    try:
        submitted_at, episode_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(submitted_at, (int, float)) and isinstance(episode_id, str):
            return float(submitted_at), episode_id
    except (ValueError, TypeError):
        pass
    raise InvalidArgument("page_token", f"{token[:40]!r} is no next_page_token of this server")
