"""What the typed client returns: plain records decoded from the public API's messages by field
name (`protos.shared.wire`), so a new API field needs only a new record field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.domain import EpisodeSpec, EpisodeState, Event, codec

EventInfo = Event
"""A state change or scheduling decision, as the orchestrator records it."""


class _Plain:
    def to_json(self) -> dict[str, Any]:
        """The record as plain data, for JSON and YAML output."""
        data: dict[str, Any] = codec.encode(self)
        return data


@dataclass(frozen=True)
class EpisodeInfo(_Plain):
    id: str
    spec: EpisodeSpec
    state: EpisodeState
    reason: str
    node: str
    sandbox_id: str
    address: str
    snapshots: int
    last_snapshot_id: str
    reward: float | None
    exit_code: int | None
    submitted_at: float
    updated_at: float
    finished_at: float
    run_seconds: float
    runs: int
    held: bool
    pinned_node: str
    group_id: str = ""
    """The GRPO group the episode is a member of; empty for none."""
    group_index: int = 0
    forked_from: str = ""
    """The snapshot this episode was forked from (another episode's); empty: not a fork."""
    fork_parent: str = ""
    fork_index: int = 0

    @property
    def finished(self) -> bool:
        return self.state.terminal

    @property
    def image(self) -> str:
        return self.spec.image

    @property
    def priority(self) -> int:
        return self.spec.preemption.priority

    @property
    def labels(self) -> dict[str, str]:
        return self.spec.labels


@dataclass(frozen=True)
class SnapshotInfo(_Plain):
    id: str
    episode_id: str
    parent_id: str
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
    forks: list[str] = field(default_factory=list)
    """The episodes forked from this snapshot."""


@dataclass(frozen=True)
class ImageInfo(_Plain):
    digest: str
    names: list[str]
    size_bytes: int = 0


@dataclass(frozen=True)
class NamedImageInfo(_Plain):
    """An image in the catalogue (`stasis image ls`)."""

    name: str
    reference: str
    digest: str
    size_bytes: int
    source: str
    created_at: float
    nodes: list[str]


@dataclass(frozen=True)
class NodeInfo(_Plain):
    name: str
    state: str
    address: str
    backend: str
    slots: int
    slots_used: int
    memory_mb: int
    memory_used_mb: int
    images: list[ImageInfo]
    episodes: list[str]
    last_heartbeat: float
    labels: dict[str, str]
    disk_mb: int = 0
    disk_used_mb: int = 0


@dataclass(frozen=True)
class SamplingInfo(_Plain):
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int


@dataclass(frozen=True)
class TurnInfo(_Plain):
    id: int
    index: int
    branch: int
    replayed: bool
    replays: int
    abandoned: bool
    token_ids: list[int]
    logprobs: list[float]
    policy_version: str
    parent_id: int
    run: int
    created_at: float
    prompt_tokens: int
    prompt_token_ids: list[int]
    finish_reason: str
    mode: str
    prefix_exact: bool
    prefix_checked: bool
    common_prefix: int
    break_reason: str
    sampling: SamplingInfo
    logprobs_exact: bool
    edge: str = ""
    """How the turn hangs in the tree (continuation, parallel, subagent, side_call, ...)."""
    edge_parent: int = 0
    """The turn it hangs from; 0 for none."""
    delivery_uncertain: bool = False
    """A delivery was under way when the orchestrator stopped: the harness may have the turn."""
    shared: bool = False
    """In a fork child's trajectory: a turn of its parent's, up to the fork's snapshot, shared."""
    episode_id: str = ""
    """The episode that recorded the turn."""


@dataclass(frozen=True)
class BranchInfo(_Plain):
    id: int
    abandoned: bool
    policy_versions: list[str]
    turns: list[TurnInfo]
    edge: str = ""
    """What the branch is: its first turn's edge."""


@dataclass(frozen=True)
class SampleInfo(_Plain):
    """One token sequence for a trainer (see `Sample` in stasis.proto)."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[str]
    turn_ids: list[int]
    branch: int
    sampling: SamplingInfo
    logprobs_exact: bool
    published_version: int
    """The policy version published when the sample was read; 0 if none was."""
    staleness: list[int]
    """Per token: published_version minus the version that sampled it (0 where not known)."""
    staleness_known: list[bool]
    """Per token: its staleness is a number; false for context and unordered versions."""


@dataclass(frozen=True)
class PolicyVersionInfo(_Plain):
    """A published policy version; 0 is none."""

    version: int
    published_at: float


@dataclass(frozen=True)
class GroupMemberInfo(_Plain):
    index: int
    episode_id: str
    state: EpisodeState
    reason: str
    reward: float | None


@dataclass(frozen=True)
class GroupInfo(_Plain):
    """Where a GRPO group stands (see `GroupResult` in stasis.proto)."""

    id: str
    task_id: str
    size: int
    final: int
    complete: bool
    broken: bool
    problem: str
    members: list[GroupMemberInfo]
    created_at: float
    max_staleness: int | None = None

    @property
    def rewards(self) -> list[float | None]:
        """Each member's reward, in index order (None: it has none, yet or ever)."""
        return [m.reward for m in self.members]


@dataclass(frozen=True)
class TrajectoryInfo:
    episode_id: str
    state: EpisodeState
    reward: float | None
    verifier_log: str
    main: BranchInfo
    branches: list[BranchInfo]
    labels: dict[str, str]
    seq: int
    samples: list[SampleInfo]
    prompt_breaks: int
    group_id: str = ""
    """The GRPO group of the episode (empty: none), and its index there."""
    group_index: int = 0
    reward_metrics: dict[str, float] = field(default_factory=dict)
    """Named numbers the verifier reported beside the reward (a Harbor task's reward.json)."""

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON: every turn of every branch, main first; the training samples; the
        prompt breaks; the reward."""
        turns = [t for b in [self.main, *self.branches] for t in b.turns]
        return {
            "episode_id": self.episode_id,
            "state": str(self.state),
            "reward": self.reward,
            "reward_metrics": self.reward_metrics,
            "turns": codec.encode(turns),
            "samples": codec.encode(self.samples),
            "prompt_breaks": self.prompt_breaks,
            "verifier_log": self.verifier_log,
        }
