"""What an episode asks for: image, entrypoint and command, files, resources, limits, preemption and reward.

Every default is defined here once, in the dataclass; parsers leave out what a user left out.
`EpisodeSpec.validate` runs once, where a spec enters the system (the public API).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from orchestrator.domain.errors import InvalidArgument
from protos.shared.address import egress_problem
from protos.shared.resources import resource_problem

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
MAX_SECONDS = 30 * 86400
"""The longest any duration of a spec may be (30 days): longer ones overflow deadlines downstream."""
MIN_PERIOD_S = 1.0
"""The shortest time slice or autosave period: each one is a checkpoint."""
MAX_FILES_BYTES = 16 << 20
"""All spec files together travel in one gRPC message and one database row."""
ARGV = {"shape": "a list of strings (argv), e.g. [python3, agent.py]"}
IMAGE = "an image name such as 'base', a digest sha256:<hex>, or a registry reference host/repo:tag"
FILES = {"shape": "a mapping of absolute paths to contents"}
REWARD_OUTPUTS = ("line", "harbor")


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    """CPU cores (a CFS quota)."""
    memory_mb: int = 1024
    """Hard memory limit in MiB; also what placement reserves on the node."""
    disk_mb: int = 10240
    """Size of the writable layer's own filesystem; a harness that fills it fails alone."""


@dataclass(frozen=True)
class Limits:
    max_wall_s: float = 0.0
    """Running time across all runs after which the episode fails; 0 means no limit."""


@dataclass(frozen=True)
class Preemption:
    time_slice_s: float = 0.0
    """Once others wait for a slot, a run longer than this is checkpointed and requeued; 0 = the
    server's default (--default-time-slice), whose 0 is never."""
    priority: int = 0
    """Higher runs first and may preempt lower; 0 = the server's default (--default-priority)."""
    autosave_s: float = 0.0
    """Period of leave-running snapshots, bounding what a lost node costs; 0 = off."""


@dataclass(frozen=True)
class RewardSpec:
    command: tuple[str, ...] = field(metadata=ARGV)
    """Runs in a verifier sandbox after the harness exits; its last output line is the reward."""
    files: dict[str, bytes] = field(default_factory=dict, metadata=FILES)
    """Files only the verifier sees (hidden tests, reference answers)."""
    image: str = ""
    """The verifier's image; empty means the episode's own."""
    timeout_s: float = 600.0
    """A verifier that runs longer is killed and the episode fails."""
    output: str = "line"
    """How the reward is read from the verifier's output: "line", its last line is the reward;
    "harbor", the last line is what a Harbor task's tests wrote (`orchestrator.task.reward`)."""


@dataclass(frozen=True)
class EpisodeSpec:
    image: str = field(metadata={"shape": IMAGE})
    """A name cached on the nodes ('base', or one `stasis image import` made), a digest, or a
    registry reference host[:port]/repo:tag or …@sha256:<hex>. A tag is pinned to its digest at submit."""
    command: tuple[str, ...] = field(default=(), metadata=ARGV)
    """Replaces the image's Cmd, as `docker run IMAGE COMMAND…` does; empty keeps it."""
    entrypoint: tuple[str, ...] | None = field(default=None, metadata=ARGV)
    """Replaces the image's Entrypoint, as `docker run --entrypoint` does ([] removes it)."""
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict, metadata=FILES)
    """Placed in the sandbox's writable layer before the command starts."""
    resources: Resources = field(default_factory=Resources)
    limits: Limits = field(default_factory=Limits)
    preemption: Preemption = field(default_factory=Preemption)
    labels: dict[str, str] = field(default_factory=dict)
    reward: RewardSpec | None = None
    egress: tuple[str, ...] = ()
    """Where the sandbox may connect besides the gateway: ADDRESS[/PREFIX][:PORT] (IPv4), on one
    TCP port or any protocol. Never loopback, link-local or multicast addresses; no host names
    (a sandbox has no DNS)."""

    def validate(self) -> EpisodeSpec:
        """Check every field; the error names the first bad one as `spec.<path>`."""
        if not isinstance(self.image, str) or not self.image.strip():
            raise InvalidArgument("spec.image", f"is required ({IMAGE})")
        if self.command:
            _argv("spec.command", self.command)
        if self.entrypoint:
            _argv("spec.entrypoint", self.entrypoint)
        for key, value in self.env.items():
            if not _ENV_KEY.fullmatch(key):
                raise InvalidArgument(f"spec.env.{key}", "is not a valid environment variable name")
            if not isinstance(value, str) or "\0" in value:
                raise InvalidArgument(f"spec.env.{key}", "must be a string without NUL bytes")
        _files("spec.files", self.files)
        if problem := resource_problem(self.resources):
            raise InvalidArgument(f"spec.resources.{problem[0]}", problem[1])
        _seconds("spec.limits.max_wall_s", self.limits.max_wall_s, 0.0, "0 means no limit")
        p = self.preemption
        _seconds("spec.preemption.time_slice_s", p.time_slice_s, MIN_PERIOD_S, "0 means the server's default")
        _seconds("spec.preemption.autosave_s", p.autosave_s, MIN_PERIOD_S, "0 means off")
        if not -1000 <= p.priority <= 1000:
            raise InvalidArgument("spec.preemption.priority", f"{p.priority} must be between -1000 and 1000")
        for key, value in self.labels.items():
            if not _LABEL_KEY.fullmatch(key):
                raise InvalidArgument(f"spec.labels.{key}", "is not a valid label key")
            if not isinstance(value, str) or len(value) > 253:
                raise InvalidArgument(f"spec.labels.{key}", "must be a string of at most 253 characters")
        if refused := egress_problem(self.egress):
            raise InvalidArgument(f"spec.egress[{refused[0]}]", refused[1])
        if self.reward is not None:
            _argv("spec.reward.command", self.reward.command)
            _files("spec.reward.files", self.reward.files)
            timeout = self.reward.timeout_s
            if not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
                raise InvalidArgument("spec.reward.timeout_s", f"{timeout} must be > 0 and <= {MAX_SECONDS}")
            if self.reward.output not in REWARD_OUTPUTS:
                raise InvalidArgument(
                    "spec.reward.output", f"{self.reward.output!r} is not one of {', '.join(REWARD_OUTPUTS)}"
                )
        return self


def _argv(name: str, argv: tuple[str, ...]) -> None:
    if not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidArgument(name, "must be a non-empty list of strings (argv)")
    if not argv[0]:
        raise InvalidArgument(f"{name}[0]", "the program must not be empty")


def _seconds(name: str, value: float, least: float, zero: str) -> None:
    """A duration that is 0 ("off", as `zero` says) or between `least` and MAX_SECONDS."""
    if not (math.isfinite(value) and (value == 0 or least <= value <= MAX_SECONDS)):
        low = f"between {least:g} and" if least else "at most"
        raise InvalidArgument(name, f"{value} must be 0 ({zero}) or {low} {MAX_SECONDS} seconds")


def _files(name: str, files: dict[str, bytes]) -> None:
    total = 0
    for path, content in files.items():
        # Canonical, so that no two keys name one file: '/a/./b' and '/a//b' are '/a/b'.
        if not path.startswith("/") or any(part in ("", ".", "..") for part in path[1:].split("/")):
            raise InvalidArgument(
                f"{name}.{path}", "must be an absolute file path without '.', '..', '//' or a trailing '/'"
            )
        total += len(content)
    if total > MAX_FILES_BYTES:
        raise InvalidArgument(name, f"hold {total} bytes together; the limit is {MAX_FILES_BYTES}")
