"""The node agents as the control loop sees them: a `NodeAgent` protocol, its gRPC client, and
the typed errors a call can end in.

This is the one place agent RPC errors become the control plane's errors. Control code branches
on their types (`SnapshotDamaged`, `SpecRefused`, ...), never on status names, and honours
`TemporaryError.delay`.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from orchestrator.domain import EpisodeSpec, NotFound, PermanentError, PullStatus, TemporaryError
from protos.shared import wire
from protos.shared.tls import TlsFiles, node_identity
from protos.stasis.v1 import agent_pb2 as pb
from protos.stasis.v1 import agent_pb2_grpc as pb_grpc

T = TypeVar("T")


class AgentUnavailable(TemporaryError):
    """The agent is down, overloaded, or busy with the same sandbox: ask again after `delay`."""


class AgentRefused(PermanentError):
    """The agent ran the request and said no; retrying the same request there will not help."""

    def __init__(self, node: str, details: str) -> None:
        super().__init__(details if details.startswith("node ") else f"node {node}: {details}")
        self.node = node


class SpecRefused(AgentRefused):
    """The sandbox spec or image is bad: every node would refuse it the same way."""


class SnapshotDamaged(AgentRefused):
    """The snapshot failed verification on the node (a chunk or the manifest is corrupt)."""


class SandboxConflict(AgentRefused):
    """The node already holds a sandbox or snapshot of that id."""


_TEMPORARY = {
    grpc.StatusCode.UNAVAILABLE: 1.0,
    grpc.StatusCode.DEADLINE_EXCEEDED: 1.0,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 2.0,
    grpc.StatusCode.ABORTED: 0.5,
    grpc.StatusCode.CANCELLED: 1.0,
}
"""Status codes worth retrying, with the delay before the next try in seconds."""

_REFUSED: dict[grpc.StatusCode, type[AgentRefused]] = {
    grpc.StatusCode.INVALID_ARGUMENT: SpecRefused,
    grpc.StatusCode.DATA_LOSS: SnapshotDamaged,
    grpc.StatusCode.ALREADY_EXISTS: SandboxConflict,
}


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxView:
    """A sandbox as its node reports it."""

    id: str
    node: str
    state: SandboxState
    exit_code: int | None
    busy: bool
    restored_from: str = ""
    timings_ms: dict[str, float] = field(default_factory=dict)
    log_start: int = 0
    """Where this sandbox's own output begins in the harness log."""

    @classmethod
    def from_pb(cls, s: pb.Sandbox) -> SandboxView:
        return wire.decode(s, cls)


@dataclass(frozen=True)
class ForkMark:
    """What a fork child learns of its fork, in /.stasis/fork.json (agent.proto's `ForkMark`)."""

    episode_id: str
    parent_episode_id: str
    snapshot_id: str
    index: int
    count: int


@dataclass(frozen=True)
class RestoreIdentity:
    """Who a restored sandbox is: its episode's address and host name, which a fork child does
    not share with the episode whose snapshot it restores; `fork` for such a child."""

    address: str
    hostname: str
    fork: ForkMark | None = None
    egress: tuple[str, ...] = ()
    """The episode's egress allowances (`EpisodeSpec.egress`)."""


@dataclass(frozen=True)
class SnapshotTarget:
    """Identity the control plane gives a snapshot before asking a node to take it."""

    snapshot_id: str
    episode_id: str
    sequence: int
    parent_id: str
    reason: str
    trajectory_cursor: Any
    """The ledger's position, sent as JSON (the codec's rule for a field that is not a string)."""


@dataclass(frozen=True)
class CheckpointOutcome:
    """A snapshot the node committed to the store."""

    snapshot_id: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    timings_ms: dict[str, float]
    since_freeze_ms: float = 0.0
    """How long before its reply the sandbox froze, by the node's clock (0: not said)."""
    manifest_digest: str = ""
    """"sha256:<hex>" of the manifest the node stored (empty from an agent that does not say:
    such a snapshot is recorded, and never restored)."""


@dataclass(frozen=True)
class VerifierResult:
    """What the verifier run in a sandbox returned: its exit code (None if it timed out), and its log."""

    exit_code: int | None
    timed_out: bool
    log: bytes
    duration_ms: float


@dataclass(frozen=True)
class ImageView:
    """An image as a node caches it."""

    digest: str
    names: list[str]
    size_bytes: int


class NodeAgent(Protocol):
    """What the control loop asks of one node's agent."""

    def resolve_image(self, reference: str) -> str:
        """The reference pinned to the manifest digest it names now (host/repo@sha256:...)."""

    def pull_image(
        self, reference: str, name: str, progress: Callable[[PullStatus], None] | None = None
    ) -> ImageView:
        """Fetch an image into the node's cache (only the layers it lacks), also under `name`;
        `progress` hears how far it has got."""

    def create(
        self, sandbox_id: str, spec: EpisodeSpec, *, address: str, hostname: str, env: dict[str, str]
    ) -> SandboxView: ...
    def checkpoint(
        self, sandbox_id: str, snapshot: SnapshotTarget, *, leave_running: bool
    ) -> CheckpointOutcome: ...
    def restore(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, image: str, identity: RestoreIdentity
    ) -> SandboxView:
        """Restore a snapshot as `identity`; the node refuses it (`SnapshotDamaged`) unless its
        manifest in the store has the digest recorded when it was taken."""

    def get(self, sandbox_id: str) -> SandboxView | None:
        """The sandbox, or None if the node has no sandbox of that id."""

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox; one that is already gone is fine."""

    def run_verifier(
        self, sandbox_id: str, command: tuple[str, ...], files: dict[str, bytes], image: str, timeout_s: float
    ) -> VerifierResult: ...

    def harness_log(
        self,
        sandbox_id: str = "",
        *,
        snapshot_id: str = "",
        offset: int | None = None,
        tail_bytes: int = 65536,
    ) -> tuple[bytes, int]:
        """A page of the harness log of a sandbox or of a committed snapshot, and the log's size:
        the last `tail_bytes`, or what follows `offset`."""


class NodeAgents(Protocol):
    """The agents of the registered nodes, by node name."""

    def set(self, node: str, address: str) -> None: ...
    def get(self, node: str) -> NodeAgent: ...
    def close(self) -> None: ...


class AgentClient:
    """One node agent over one gRPC channel; with `tls`, mutual TLS that accepts only the agent
    whose certificate names this node."""

    def __init__(self, node: str, address: str, tls: TlsFiles | None = None, timeout_s: float = 600) -> None:
        self.node = node
        self.address = address
        self.timeout_s = timeout_s
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self._channel = (
            tls.channel(address, node_identity(node), options)
            if tls
            else grpc.insecure_channel(address, options=options)
        )
        self._stub = pb_grpc.SandboxAgentStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            details = exc.details() or code.name
            if code in _TEMPORARY:
                raise AgentUnavailable(
                    f"node {self.node} ({self.address}) {what}: {code.name}: {details}",
                    delay=_TEMPORARY[code],
                ) from exc
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(details) from exc
            raise _REFUSED.get(code, AgentRefused)(self.node, details) from exc

    def _call(self, what: str, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        with self._errors(what):
            return method(request, timeout=timeout or self.timeout_s)

    def create(
        self, sandbox_id: str, spec: EpisodeSpec, *, address: str, hostname: str, env: dict[str, str]
    ) -> SandboxView:
        request = pb.CreateSandboxRequest(
            sandbox_id=sandbox_id,
            spec=wire.encode(
                spec, pb.SandboxSpec, env={**spec.env, **env}, hostname=hostname, address=address
            ),
            files=spec.files,
        )
        return SandboxView.from_pb(self._call("create", self._stub.CreateSandbox, request))

    def resolve_image(self, reference: str) -> str:
        request = pb.ResolveImageRequest(reference=reference)
        return self._call("resolve image", self._stub.ResolveImage, request, 180).pinned

    def pull_image(
        self, reference: str, name: str, progress: Callable[[PullStatus], None] | None = None
    ) -> ImageView:
        request = pb.PullImageRequest(name=name, reference=reference)
        with self._errors("pull image"):
            for m in self._stub.PullImage(request, timeout=3600):
                if m.HasField("image"):
                    return wire.decode(m.image, ImageView)
                if progress is not None:
                    progress(wire.decode(m, PullStatus, node=self.node))
        raise AgentUnavailable(f"node {self.node} ended its pull of {reference} without an image", delay=2)

    def checkpoint(
        self, sandbox_id: str, snapshot: SnapshotTarget, *, leave_running: bool
    ) -> CheckpointOutcome:
        request = pb.CheckpointRequest(
            sandbox_id=sandbox_id,
            leave_running=leave_running,
            snapshot=wire.encode(snapshot, pb.SnapshotTarget),
        )
        return wire.decode(self._call("checkpoint", self._stub.Checkpoint, request), CheckpointOutcome)

    def restore(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, image: str, identity: RestoreIdentity
    ) -> SandboxView:
        request = pb.RestoreRequest(
            sandbox_id=sandbox_id, snapshot_id=snapshot_id, manifest_digest=manifest_digest, image=image,
            address=identity.address, hostname=identity.hostname, egress=identity.egress,
            fork=wire.encode(identity.fork, pb.ForkMark) if identity.fork else None,
        )  # fmt: skip
        return SandboxView.from_pb(self._call("restore", self._stub.Restore, request))

    def get(self, sandbox_id: str) -> SandboxView | None:
        try:
            return SandboxView.from_pb(
                self._call("get", self._stub.GetSandbox, pb.GetSandboxRequest(sandbox_id=sandbox_id), 30)
            )
        except NotFound:
            return None

    def delete(self, sandbox_id: str) -> None:
        try:
            self._call(
                "delete", self._stub.DeleteSandbox, pb.DeleteSandboxRequest(sandbox_id=sandbox_id), 120
            )
        except NotFound:
            return

    def run_verifier(
        self, sandbox_id: str, command: tuple[str, ...], files: dict[str, bytes], image: str, timeout_s: float
    ) -> VerifierResult:
        request = pb.RunVerifierRequest(
            sandbox_id=sandbox_id, command=list(command), files=files, image=image, timeout_s=timeout_s
        )
        return wire.decode(
            self._call("verifier", self._stub.RunVerifier, request, timeout_s + 120), VerifierResult
        )

    def harness_log(
        self,
        sandbox_id: str = "",
        *,
        snapshot_id: str = "",
        offset: int | None = None,
        tail_bytes: int = 65536,
    ) -> tuple[bytes, int]:
        request = pb.GetHarnessLogRequest(
            sandbox_id=sandbox_id, snapshot_id=snapshot_id, tail_bytes=tail_bytes,
            from_offset=offset is not None, offset=offset or 0,
        )  # fmt: skip
        r = self._call("log", self._stub.GetHarnessLog, request, 120)
        return r.content, r.size


class AgentPool:
    """gRPC clients for the registered nodes, rebuilt when a node re-registers at a new address."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls
        self._clients: dict[str, AgentClient] = {}
        self._lock = threading.Lock()

    def set(self, node: str, address: str) -> None:
        with self._lock:
            old = self._clients.get(node)
            if old is not None and old.address == address:
                return
            self._clients[node] = AgentClient(node, address, self.tls)
        if old is not None:
            old.close()

    def get(self, node: str) -> AgentClient:
        with self._lock:
            client = self._clients.get(node)
        if client is None:
            raise AgentUnavailable(f"node {node} has not registered with this orchestrator yet", delay=2)
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
