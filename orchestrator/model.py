"""The control plane's domain: episodes and their specs, states, events, nodes and snapshot records."""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import InvalidArgument


class EpisodeState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    PREEMPTED = "PREEMPTED"
    RESTORING = "RESTORING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({EpisodeState.SUCCEEDED, EpisodeState.FAILED, EpisodeState.CANCELLED})

# Every move the state machine allows. Anything live may fail or be cancelled.
ALLOWED: dict[EpisodeState, frozenset[EpisodeState]] = {
    EpisodeState.PENDING: frozenset({EpisodeState.RUNNING}),
    EpisodeState.RUNNING: frozenset(
        {EpisodeState.CHECKPOINTING, EpisodeState.SUCCEEDED, EpisodeState.PENDING, EpisodeState.PREEMPTED}
    ),
    EpisodeState.CHECKPOINTING: frozenset(
        {EpisodeState.PREEMPTED, EpisodeState.RUNNING, EpisodeState.PENDING}
    ),
    EpisodeState.PREEMPTED: frozenset({EpisodeState.RESTORING, EpisodeState.PENDING}),
    EpisodeState.RESTORING: frozenset({EpisodeState.RUNNING, EpisodeState.PREEMPTED, EpisodeState.PENDING}),
    EpisodeState.SUCCEEDED: frozenset(),
    EpisodeState.FAILED: frozenset(),
    EpisodeState.CANCELLED: frozenset(),
}
for _state in EpisodeState:
    if not _state.terminal:
        ALLOWED[_state] = ALLOWED[_state] | {EpisodeState.FAILED, EpisodeState.CANCELLED}


class NodeState(enum.StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    LOST = "LOST"


class Reason(enum.StrEnum):
    """Why a snapshot was taken; the snapshot store records the same words."""

    MANUAL = "manual"
    TIME_SLICE = "time-slice"
    PRIORITY = "priority"
    DRAIN = "drain"
    AUTOSAVE = "autosave"


_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
MAX_FILES_BYTES = 16 << 20
"""All spec files together travel in one gRPC message and one database row."""


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    """CPU cores (a CFS quota)."""
    memory_mb: int = 1024
    """Hard memory limit in MiB; also what placement reserves on the node."""


@dataclass(frozen=True)
class Limits:
    max_wall_s: float = 0.0
    """Running time across all runs after which the episode fails; 0 means no limit."""


@dataclass(frozen=True)
class Preemption:
    time_slice_s: float = 0.0
    """Once others wait for a slot, a run longer than this is checkpointed and requeued; 0 = never."""
    priority: int = 0
    """Higher runs first and may preempt lower."""
    autosave_s: float = 0.0
    """Period of leave-running snapshots, bounding what a lost node costs; 0 = off."""


@dataclass(frozen=True)
class RewardSpec:
    command: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    image: str = ""
    timeout_s: float = 600.0
    """A verifier that runs longer is killed and the episode fails."""


@dataclass(frozen=True)
class EpisodeSpec:
    image: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    limits: Limits = field(default_factory=Limits)
    preemption: Preemption = field(default_factory=Preemption)
    labels: dict[str, str] = field(default_factory=dict)
    reward: RewardSpec | None = None

    def validate(self) -> EpisodeSpec:
        """Check every field; the error names the first bad one as `spec.<path>`."""
        if not isinstance(self.image, str) or not self.image.strip():
            raise InvalidArgument("spec.image", "is required (an image name such as 'base', or sha256:<hex>)")
        _argv("spec.command", self.command)
        for key, value in self.env.items():
            if not _ENV_KEY.match(key):
                raise InvalidArgument(f"spec.env.{key}", "is not a valid environment variable name")
            if not isinstance(value, str) or "\0" in value:
                raise InvalidArgument(f"spec.env.{key}", "must be a string without NUL bytes")
        _files("spec.files", self.files)
        r = self.resources
        if not 0 < r.cpus <= 256:
            raise InvalidArgument("spec.resources.cpus", f"{r.cpus} must be > 0 and <= 256")
        if not 16 <= r.memory_mb <= 1 << 20:
            raise InvalidArgument("spec.resources.memory_mb", f"{r.memory_mb} must be between 16 and 1048576")
        if self.limits.max_wall_s < 0:
            raise InvalidArgument("spec.limits.max_wall_s", "must be >= 0 (0 means no limit)")
        p = self.preemption
        if p.time_slice_s < 0:
            raise InvalidArgument("spec.preemption.time_slice_s", "must be >= 0 (0 means never time-sliced)")
        if p.autosave_s < 0:
            raise InvalidArgument("spec.preemption.autosave_s", "must be >= 0 (0 means off)")
        if not -1000 <= p.priority <= 1000:
            raise InvalidArgument("spec.preemption.priority", f"{p.priority} must be between -1000 and 1000")
        for key, value in self.labels.items():
            if not _LABEL_KEY.match(key):
                raise InvalidArgument(f"spec.labels.{key}", "is not a valid label key")
            if not isinstance(value, str) or len(value) > 253:
                raise InvalidArgument(f"spec.labels.{key}", "must be a string of at most 253 characters")
        if self.reward is not None:
            _argv("spec.reward.command", self.reward.command)
            _files("spec.reward.files", self.reward.files)
            if self.reward.timeout_s <= 0:
                raise InvalidArgument("spec.reward.timeout_s", "must be > 0")
        return self


def _argv(name: str, argv: tuple[str, ...]) -> None:
    if not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidArgument(name, "must be a non-empty list of strings (argv)")
    if not argv[0]:
        raise InvalidArgument(f"{name}[0]", "the program must not be empty")


def _files(name: str, files: dict[str, bytes]) -> None:
    total = 0
    for path, content in files.items():
        parts = path.split("/")
        if not path.startswith("/") or ".." in parts or path == "/":
            raise InvalidArgument(f"{name}.{path}", "must be an absolute file path without '..'")
        total += len(content)
    if total > MAX_FILES_BYTES:
        raise InvalidArgument(name, f"hold {total} bytes together; the limit is {MAX_FILES_BYTES}")


@dataclass
class Episode:
    id: str
    spec: EpisodeSpec
    state: EpisodeState
    reason: str
    submitted_at: float
    updated_at: float
    address: str
    token: str
    """Bearer token the episode's harness presents to the inference gateway."""
    node: str = ""
    sandbox_id: str = ""
    runs: int = 0
    """How many sandboxes this episode has had: each start or restore is a new run."""
    run_started_at: float = 0.0
    run_seconds: float = 0.0
    """Running time of finished runs; the current run adds now - run_started_at."""
    queued_at: float = 0.0
    """When the episode last began to wait; the oldest waiter resumes first."""
    held: bool = False
    """Preempted by hand: waits for ResumeEpisode instead of being rescheduled."""
    pinned_node: str = ""
    snapshots: int = 0
    last_snapshot_id: str = ""
    restored_from: str = ""
    """The snapshot the current run was restored from; empty for a fresh start."""
    pending_snapshot_id: str = ""
    """A snapshot asked of an agent and not yet known to be committed."""
    pending_reason: str = ""
    last_autosave_at: float = 0.0
    exit_code: int | None = None
    reward: float | None = None
    finished_at: float = 0.0
    not_before: float = 0.0
    """After a failed attempt, the scheduler leaves the episode alone until then."""
    attempts: int = 0
    """Consecutive failed start/restore attempts."""

    @property
    def priority(self) -> int:
        return self.spec.preemption.priority

    def current_run_s(self, now: float) -> float:
        return (
            now - self.run_started_at if self.state == EpisodeState.RUNNING and self.run_started_at else 0.0
        )

    def total_run_s(self, now: float) -> float:
        return self.run_seconds + self.current_run_s(now)


@dataclass(frozen=True)
class Event:
    seq: int
    episode_id: str
    kind: str
    """transition | decision | node"""
    from_state: str
    to_state: str
    reason: str
    message: str
    node: str
    at: float


@dataclass
class NodeRecord:
    name: str
    address: str
    state: NodeState
    backend: str
    slots: int
    memory_mb: int
    images: dict[str, list[str]]
    """digest -> names"""
    labels: dict[str, str]
    registered_at: float
    last_heartbeat: float = 0.0

    def has_image(self, ref: str) -> bool:
        return ref in self.images or any(ref in names for names in self.images.values())


@dataclass(frozen=True)
class SnapshotRecord:
    id: str
    episode_id: str
    sequence: int
    parent_id: str
    node: str
    reason: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    trajectory_cursor: Any
    timings_ms: dict[str, float]


def address_pool(cidr: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError as exc:
        raise InvalidArgument("address_pool", f"{cidr!r} is not an IPv4 network: {exc}") from exc
    if net.num_addresses < 4:
        raise InvalidArgument("address_pool", f"{cidr} is too small")
    return net
