"""What a sandbox is: its validated spec, its state and its node-local record."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from protos.shared.address import egress_problem
from protos.shared.resources import resource_problem
from sandbox_agent.errors import InvalidSpec
from sandbox_agent.host import idmap, network
from sandbox_agent.host.overlay import sandbox_path

_ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$")

MAX_FILE_BYTES = 16 << 20
"""Spec files travel inside one gRPC message; bigger payloads belong in the image."""


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    UNKNOWN = "unknown"


def validate_id(field_name: str, value: str) -> str:
    if not _ID.fullmatch(value or ""):
        raise InvalidSpec(
            field_name, f"{value!r} must be 1-63 of [a-z0-9_.-], starting with a letter or digit"
        )
    return value


def validate_hostname(field_name: str, value: str) -> str:
    if not _HOSTNAME.match(value or ""):
        raise InvalidSpec(field_name, f"{value!r} is not a valid lowercase host name")
    return value


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    """CPU cores as a CFS quota; 1 core keeps a 2-core node able to run two sandboxes."""
    memory_mb: int = 1024
    """Hard memory limit in MiB; room for a Python or Node.js harness with a model client. The
    same default as an episode spec's, so a sandbox made by hand matches one the orchestrator asks for."""
    pids: int = 1024
    """Process limit; stops a fork bomb in a harness's shell tool from taking the node."""
    disk_mb: int = 10240
    """Size of the writable layer's own filesystem (runc): a harness that fills it gets ENOSPC,
    and the node's disk, its neighbours and their checkpoints are untouched."""
    inodes: int = 1 << 20
    """How many files and directories the writable layer holds."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to build the same sandbox again on any node."""

    image: str
    command: tuple[str, ...] = ()
    """Empty: the image's Cmd (see `launch`)."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    """Empty: the image's WorkingDir, else /."""
    hostname: str = "sandbox"
    address: str = ""
    resources: Resources = field(default_factory=Resources)
    entrypoint: tuple[str, ...] | None = None
    """None: the image's Entrypoint."""
    user: str = ""
    """Empty: the image's User, else root. Once launched, always numeric uid:gid."""
    egress: tuple[str, ...] = ()
    """Where the sandbox may connect besides the gateway: ADDRESS[/PREFIX][:PORT] (IPv4)
    (`network.allow_egress`)."""
    userns_base: int = 0
    """The host id of the sandbox's uid and gid 0; its ids 0..65535 are host ids from there on
    (`idmap`). 0: no user namespace, and the sandbox's root is the node's root. A node sets it
    when it makes a sandbox; a restore keeps the one its checkpoint was taken with."""

    def validated(self) -> SandboxSpec:
        if not self.image:
            raise InvalidSpec("image", "must name an image")
        argv = (*(self.entrypoint or ()), *self.command)
        if any(not isinstance(a, str) for a in argv):
            raise InvalidSpec("command", "must be a list of strings (argv)")
        if argv and not argv[0]:
            raise InvalidSpec("command[0]", "the program must not be empty")
        if self.user and not _USER.match(self.user):
            raise InvalidSpec("user", f"{self.user!r} is not a user, uid, user:group or uid:gid")
        for key, value in self.env.items():
            if not _ENV_KEY.match(key):
                raise InvalidSpec(f"env[{key}]", "is not a valid environment variable name")
            if "\0" in value:
                raise InvalidSpec(f"env[{key}]", "contains a NUL byte")
        if self.cwd and self.cwd != "/":
            sandbox_path("cwd", self.cwd)
        validate_hostname("hostname", self.hostname)
        network.validate_address(self.address)
        if refused := egress_problem(self.egress):
            raise InvalidSpec(f"egress[{refused[0]}]", refused[1])
        if self.egress and not self.address:
            raise InvalidSpec("egress", "needs an address: a sandbox without one has no network")
        if self.userns_base:
            if not 0 < self.userns_base <= (1 << 32) - idmap.SIZE:
                raise InvalidSpec(
                    "userns_base", f"{self.userns_base} must be between 1 and {(1 << 32) - idmap.SIZE}"
                )
            if self.user and any(int(i) >= idmap.SIZE for i in self.user.split(":") if i.isdigit()):
                raise InvalidSpec("user", f"{self.user!r} is outside the sandbox's ids 0..{idmap.SIZE - 1}")
        if problem := resource_problem(self.resources):
            raise InvalidSpec(f"resources.{problem[0]}", problem[1])
        return self

    @property
    def ids(self) -> tuple[int, int]:
        """The numeric uid and gid of a launched spec."""
        uid, _, gid = (self.user or "0:0").partition(":")
        return int(uid), int(gid or 0)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["command"] = list(self.command)
        d["entrypoint"] = list(self.entrypoint) if self.entrypoint is not None else None
        d["egress"] = list(self.egress)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxSpec:
        entrypoint = d.get("entrypoint")
        return cls(
            image=d["image"],
            command=tuple(d["command"]),
            env=dict(d.get("env", {})),
            cwd=d.get("cwd", ""),
            hostname=d.get("hostname", "sandbox"),
            address=d.get("address", ""),
            resources=Resources(**d.get("resources", {})),
            entrypoint=tuple(entrypoint) if entrypoint is not None else None,
            user=d.get("user", ""),
            egress=tuple(d.get("egress", ())),
            userns_base=d.get("userns_base", 0),
        )


def validate_files(files: dict[str, bytes]) -> dict[str, bytes]:
    for path, content in files.items():
        sandbox_path(f"files[{path}]", path)
        if len(content) > MAX_FILE_BYTES:
            raise InvalidSpec(f"files[{path}]", f"is {len(content)} bytes; the limit is {MAX_FILE_BYTES}")
    return files


@dataclass
class SandboxRecord:
    """The node's durable note of one sandbox, kept in `<root>/sandboxes/<id>/sandbox.json`."""

    id: str
    node: str
    backend: str
    spec: SandboxSpec
    image_digest: str
    created_at: float
    restored_from: str = ""
    """The snapshot id, or checkpoint directory, this sandbox was restored from."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Milliseconds per phase of making this sandbox (`phases.Phase`): pull, and a restore's."""
    log_start: int = 0
    """Where this sandbox's own output begins in the harness log (earlier runs wrote the rest)."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["spec"] = self.spec.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxRecord:
        return cls(**{**d, "spec": SandboxSpec.from_json(d["spec"])})

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)


@dataclass(frozen=True)
class SandboxStatus:
    record: SandboxRecord
    state: SandboxState
    pid: int = 0
    exit_code: int | None = None
    busy: bool = False
    """An operation is in progress, so the state may be about to change."""
