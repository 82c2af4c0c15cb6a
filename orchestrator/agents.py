"""Typed calls to node agents. The one place agent RPC errors become the control plane's errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from orchestrator.errors import NotFound, PermanentError, TemporaryError
from orchestrator.model import EpisodeSpec
from protos.stasis.v1 import agent_pb2 as pb
from protos.stasis.v1 import agent_pb2_grpc as pb_grpc

T = TypeVar("T")

# Worth retrying: the agent is down, overloaded or busy with the same sandbox.
_TEMPORARY = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
}

_STATES = {
    pb.SANDBOX_STATE_RUNNING: "running",
    pb.SANDBOX_STATE_PAUSED: "paused",
    pb.SANDBOX_STATE_EXITED: "exited",
}


class AgentRefused(PermanentError):
    """The agent ran the request and said no; `code` is its gRPC status name."""

    def __init__(self, node: str, code: str, details: str) -> None:
        super().__init__(details if details.startswith("node ") else f"node {node}: {details}")
        self.node = node
        self.code = code


@dataclass(frozen=True)
class SandboxView:
    id: str
    node: str
    state: str
    """running | paused | exited | unknown"""
    exit_code: int | None
    busy: bool
    restore_timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_pb(cls, s: pb.Sandbox) -> SandboxView:
        t = s.restore_timings
        return cls(
            id=s.id,
            node=s.node,
            state=_STATES.get(s.state, "unknown"),
            exit_code=s.exit_code if s.has_exit_code else None,
            busy=s.busy,
            restore_timings={
                "fetch_ms": t.fetch_ms,
                "verify_ms": t.verify_ms,
                "restore_ms": t.restore_ms,
                "total_ms": t.total_ms,
            },
        )


@dataclass(frozen=True)
class CheckpointOutcome:
    snapshot_id: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    timings_ms: dict[str, float]


@dataclass(frozen=True)
class VerifierOutcome:
    exit_code: int | None
    timed_out: bool
    log: bytes
    duration_ms: float


class AgentClient:
    """One node agent, over one channel."""

    def __init__(self, node: str, address: str, timeout_s: float = 600) -> None:
        self.node = node
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
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
                raise TemporaryError(
                    f"node {self.node} ({self.address}) {what}: {code.name}: {details}"
                ) from exc
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(details) from exc
            raise AgentRefused(self.node, code.name, details) from exc

    def _call(self, what: str, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        with self._errors(what):
            return method(request, timeout=timeout or self.timeout_s)

    def create(
        self, sandbox_id: str, spec: EpisodeSpec, *, address: str, hostname: str, env: dict[str, str]
    ) -> SandboxView:
        request = pb.CreateSandboxRequest(
            sandbox_id=sandbox_id,
            spec=pb.SandboxSpec(
                image=spec.image,
                command=list(spec.command),
                env={**spec.env, **env},
                cwd="/",
                hostname=hostname,
                address=address,
                resources=pb.Resources(cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb),
            ),
            files=spec.files,
        )
        return SandboxView.from_pb(self._call("create", self._stub.CreateSandbox, request))

    def checkpoint(
        self,
        sandbox_id: str,
        *,
        snapshot_id: str,
        episode_id: str,
        sequence: int,
        parent_id: str,
        reason: str,
        trajectory_cursor: Any,
        leave_running: bool,
    ) -> CheckpointOutcome:
        request = pb.CheckpointRequest(
            sandbox_id=sandbox_id,
            leave_running=leave_running,
            snapshot=pb.SnapshotTarget(
                snapshot_id=snapshot_id,
                episode_id=episode_id,
                sequence=sequence,
                parent_id=parent_id,
                reason=reason,
                trajectory_cursor=json.dumps(trajectory_cursor) if trajectory_cursor is not None else "",
            ),
        )
        r = self._call("checkpoint", self._stub.Checkpoint, request)
        return CheckpointOutcome(
            snapshot_id=r.snapshot_id,
            created_at=r.created_at,
            logical_bytes=r.logical_bytes,
            stored_bytes=r.stored_bytes,
            new_bytes=r.new_bytes,
            timings_ms={
                "frozen_ms": r.timings.frozen_ms,
                "dump_ms": r.timings.dump_ms,
                "layer_ms": r.timings.layer_ms,
                "put_ms": r.put_ms,
            },
        )

    def restore(self, sandbox_id: str, snapshot_id: str, image: str) -> SandboxView:
        request = pb.RestoreRequest(sandbox_id=sandbox_id, snapshot_id=snapshot_id, image=image)
        return SandboxView.from_pb(self._call("restore", self._stub.Restore, request))

    def get(self, sandbox_id: str) -> SandboxView | None:
        try:
            return SandboxView.from_pb(
                self._call("get", self._stub.GetSandbox, pb.GetSandboxRequest(sandbox_id=sandbox_id), 30)
            )
        except NotFound:
            return None

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox; one that is already gone is fine."""
        try:
            self._call(
                "delete", self._stub.DeleteSandbox, pb.DeleteSandboxRequest(sandbox_id=sandbox_id), 120
            )
        except NotFound:
            return

    def run_verifier(
        self, sandbox_id: str, command: tuple[str, ...], files: dict[str, bytes], image: str, timeout_s: float
    ) -> VerifierOutcome:
        request = pb.RunVerifierRequest(
            sandbox_id=sandbox_id, command=list(command), files=files, image=image, timeout_s=timeout_s
        )
        r = self._call("verifier", self._stub.RunVerifier, request, timeout_s + 120)
        return VerifierOutcome(
            exit_code=r.exit_code if r.has_exit_code else None,
            timed_out=r.timed_out,
            log=r.log,
            duration_ms=r.duration_ms,
        )


class AgentPool:
    """Clients for the registered nodes, rebuilt when a node re-registers at a new address."""

    def __init__(self) -> None:
        self._clients: dict[str, AgentClient] = {}
        self._lock = threading.Lock()

    def set(self, node: str, address: str) -> None:
        with self._lock:
            old = self._clients.get(node)
            if old is not None and old.address == address:
                return
            self._clients[node] = AgentClient(node, address)
        if old is not None:
            old.close()

    def get(self, node: str) -> AgentClient:
        with self._lock:
            client = self._clients.get(node)
        if client is None:
            raise TemporaryError(f"node {node} has not registered with this orchestrator yet", delay=2)
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
