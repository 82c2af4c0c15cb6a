"""The agent's gRPC face: protobuf in, domain calls, protobuf out; errors map to status codes here."""

from __future__ import annotations

import logging
import signal as signals
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.shared import wire
from protos.shared.admission import Admission
from protos.shared.relay import relay
from protos.shared.status import guarded, snapshot_status
from protos.shared.tls import ORCHESTRATOR, TlsFiles, bind, peer_identity
from protos.stasis.v1 import agent_pb2 as pb
from protos.stasis.v1 import agent_pb2_grpc as pb_grpc
from sandbox_agent.checkpoint import CheckpointImage
from sandbox_agent.errors import (
    AgentError,
    AlreadyExists,
    Busy,
    CommandFailed,
    FailedPrecondition,
    InvalidSpec,
    NoRoom,
    NotFound,
    ToolUnavailable,
)
from sandbox_agent.images import oci
from sandbox_agent.images.cache import Image
from sandbox_agent.node import Identity, Node, SnapshotTarget
from sandbox_agent.spec import SandboxSpec, SandboxState, SandboxStatus
from snapshots import Manifest, SnapshotError

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[AgentError], grpc.StatusCode]] = [
    (InvalidSpec, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ToolUnavailable, grpc.StatusCode.UNAVAILABLE),
    (Busy, grpc.StatusCode.ABORTED),
    (NoRoom, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CommandFailed, grpc.StatusCode.INTERNAL),
]

F = TypeVar("F", bound=Callable[..., Any])


def status_code(exc: AgentError | SnapshotError) -> grpc.StatusCode:
    if isinstance(exc, SnapshotError):
        return snapshot_status(exc)
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)


def _rpc(method: F) -> F:
    """Map agent and snapshot errors to status codes, for unary and server-streaming methods."""

    def abort(self: AgentService, context: grpc.ServicerContext, exc: AgentError | SnapshotError) -> None:
        code = status_code(exc)
        if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
            log.error("%s failed: %s", method.__name__, exc)
        context.abort(code, f"node {self.node.name}: {exc}")

    return guarded(method, (AgentError, SnapshotError), abort)


def spec_from_pb(msg: pb.SandboxSpec) -> SandboxSpec:
    """Unset resources take `Resources`' defaults."""
    return wire.decode(msg, SandboxSpec, hostname=msg.hostname or "sandbox")


def sandbox_to_pb(status: SandboxStatus) -> pb.Sandbox:
    return wire.encode(
        status.record, pb.Sandbox,
        state=status.state, pid=status.pid, exit_code=status.exit_code, busy=status.busy,
    )  # fmt: skip


def checkpoint_to_pb(c: CheckpointImage, manifest: Manifest | None = None) -> pb.CheckpointResult:
    """A checkpoint left in its directory, or (with its manifest) one put in the snapshot store."""
    stored: dict[str, Any] = {}
    if manifest is not None:
        sizes = manifest.sizes
        stored = {
            "snapshot_id": manifest.snapshot_id, "manifest_digest": manifest.digest,
            "logical_bytes": sizes.logical_bytes, "stored_bytes": sizes.stored_bytes, "new_bytes": sizes.new_bytes,
        }  # fmt: skip
    return wire.encode(
        c, pb.CheckpointResult,
        directory="" if manifest is not None else str(c.directory),
        criu_bytes=c.sizes.criu_bytes,
        layer_bytes=c.sizes.layer_bytes,
        since_freeze_ms=max(0.0, (time.time() - c.created_at) * 1000),
        **stored,
    )  # fmt: skip


def image_to_pb(image: Image) -> pb.Image:
    return wire.encode(image, pb.Image)


def node_info_pb(node: Node, sandboxes: list[SandboxStatus] | None = None) -> pb.NodeInfo:
    """The node's settings (slots, memory_mb, labels) and what it has now."""
    sandboxes = node.list() if sandboxes is None else sandboxes
    return wire.encode(
        node.settings, pb.NodeInfo,
        name=node.name, backend=node.backend.name, criu_version=node.ctx.criu_version,
        images=node.images.list(),
        running=sum(1 for st in sandboxes if st.state != SandboxState.EXITED),
        disk_mb=node.disk.capacity_mb, restores_forks=node.backend.checkpoints.places_files,
    )  # fmt: skip


def _path(field: str, value: str) -> Path:
    if not value or not value.startswith("/"):
        raise InvalidSpec(field, f"{value!r} must be an absolute path on the node")
    return Path(value)


class AgentService(pb_grpc.SandboxAgentServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    @_rpc
    def CreateSandbox(self, request: pb.CreateSandboxRequest, context: grpc.ServicerContext) -> pb.Sandbox:
        if not request.HasField("spec"):
            raise InvalidSpec("spec", "is required")
        status = self.node.create(request.sandbox_id, spec_from_pb(request.spec), dict(request.files))
        return sandbox_to_pb(status)

    @_rpc
    def Checkpoint(self, request: pb.CheckpointRequest, context: grpc.ServicerContext) -> pb.CheckpointResult:
        if request.HasField("snapshot") == bool(request.directory):
            raise InvalidSpec("directory", "give exactly one of directory and snapshot")
        if request.directory:
            dest = _path("directory", request.directory)
            return checkpoint_to_pb(
                self.node.checkpoint(request.sandbox_id, dest, leave_running=request.leave_running)
            )
        try:
            target = wire.decode(request.snapshot, SnapshotTarget)
        except ValueError as exc:  # the cursor, the one field that carries JSON
            raise InvalidSpec("snapshot.trajectory_cursor", f"is not JSON: {exc}") from exc
        captured, manifest = self.node.checkpoint_to_store(
            request.sandbox_id, target, leave_running=request.leave_running
        )
        return checkpoint_to_pb(captured, manifest)

    @_rpc
    def Restore(self, request: pb.RestoreRequest, context: grpc.ServicerContext) -> pb.Sandbox:
        if bool(request.snapshot_id) == bool(request.directory):
            raise InvalidSpec("directory", "give exactly one of directory and snapshot_id")
        identity = wire.decode(request, Identity)  # empty fields keep the checkpoint's
        if request.snapshot_id:
            status = self.node.restore_from_store(
                request.sandbox_id, request.snapshot_id, request.manifest_digest,
                image=request.image, identity=identity,
            )  # fmt: skip
        else:
            source = _path("directory", request.directory)
            status = self.node.restore(
                request.sandbox_id, source, image=request.image, verify=not request.skip_verify,
                identity=identity,
            )  # fmt: skip
        return sandbox_to_pb(status)

    @_rpc
    def Kill(self, request: pb.KillRequest, context: grpc.ServicerContext) -> pb.Sandbox:
        return sandbox_to_pb(self.node.kill(request.sandbox_id, request.signal or signals.SIGKILL))

    @_rpc
    def DeleteSandbox(
        self, request: pb.DeleteSandboxRequest, context: grpc.ServicerContext
    ) -> pb.DeleteSandboxResponse:
        self.node.delete(request.sandbox_id)
        return pb.DeleteSandboxResponse()

    @_rpc
    def GetSandbox(self, request: pb.GetSandboxRequest, context: grpc.ServicerContext) -> pb.Sandbox:
        return sandbox_to_pb(self.node.get(request.sandbox_id))

    @_rpc
    def ListSandboxes(
        self, request: pb.ListSandboxesRequest, context: grpc.ServicerContext
    ) -> pb.ListSandboxesResponse:
        return pb.ListSandboxesResponse(sandboxes=[sandbox_to_pb(s) for s in self.node.list()])

    @_rpc
    def GetHarnessLog(
        self, request: pb.GetHarnessLogRequest, context: grpc.ServicerContext
    ) -> pb.GetHarnessLogResponse:
        offset = request.offset if request.from_offset else None
        tail = request.tail_bytes or 65536
        if request.snapshot_id:
            content, size = self.node.snapshot_log(request.snapshot_id, tail, offset)
        else:
            content, size = self.node.log_page(request.sandbox_id, tail, offset)
        return pb.GetHarnessLogResponse(content=content, size=size)

    @_rpc
    def GetNodeInfo(self, request: pb.GetNodeInfoRequest, context: grpc.ServicerContext) -> pb.NodeInfo:
        return node_info_pb(self.node)

    @_rpc
    def RunVerifier(self, request: pb.RunVerifierRequest, context: grpc.ServicerContext) -> pb.VerifierResult:
        result = self.node.run_verifier(
            request.sandbox_id,
            tuple(request.command),
            dict(request.files),
            image=request.image,
            timeout_s=request.timeout_s or 600,
        )
        return wire.encode(result, pb.VerifierResult)

    @_rpc
    def ImportImage(self, request: pb.ImportImageRequest, context: grpc.ServicerContext) -> pb.Image:
        source = request.WhichOneof("source")
        if source == "tarball":
            image = self.node.images.import_tarball(_path("tarball", request.tarball), request.name)
        elif source == "directory":
            image = self.node.images.import_directory(_path("directory", request.directory), request.name)
        elif source == "docker_image":
            from sandbox_agent.runtime.docker_backend import import_docker_image

            docker_url = self.node.settings.docker_url
            image = import_docker_image(self.node.images, request.docker_image, request.name, docker_url)
        else:
            raise InvalidSpec("source", "one of tarball, directory or docker_image is required")
        return image_to_pb(image)

    @_rpc
    def PullImage(
        self, request: pb.PullImageRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.PullProgress]:
        reference = request.reference
        if not oci.is_pullable(reference):
            raise InvalidSpec(
                "reference",
                f"{reference!r} is not a registry reference (host[:port]/repo:tag or @sha256:...) "
                f"or a {', '.join(oci.TRANSPORTS)} source",
            )
        image = yield from relay(
            lambda report: self.node.images.pull(
                reference,
                self.node.registry,
                request.name,
                lambda p: report(
                    pb.PullProgress(phase=p.phase, bytes_done=p.bytes_done, bytes_total=p.bytes_total)
                ),
            ),
            name=f"pull-{self.node.name}",
        )
        yield pb.PullProgress(phase="done", image=image_to_pb(image))

    @_rpc
    def ResolveImage(
        self, request: pb.ResolveImageRequest, context: grpc.ServicerContext
    ) -> pb.ResolveImageResponse:
        parsed = oci.Reference.parse(request.reference)
        if parsed is None:
            raise InvalidSpec("reference", f"{request.reference!r} is not a registry reference")
        digest = oci.resolve(request.reference, self.node.registry)
        return pb.ResolveImageResponse(pinned=parsed.pinned(digest), digest=digest)


@contextmanager
def _orchestrator_only(method: str, context: grpc.ServicerContext) -> Iterator[None]:
    """The admission policy of a node with TLS: only the orchestrator's certificate may call."""
    identity = peer_identity(context)
    if identity != ORCHESTRATOR:
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"this node agent serves only {ORCHESTRATOR}; the caller's certificate is for {identity!r}",
        )
    yield


def serve(
    node: Node, listen: str, tls: TlsFiles | None = None, max_workers: int = 16
) -> tuple[grpc.Server, int]:
    """Start the agent's gRPC server with health and reflection; returns it and its bound port.
    With `tls`, a caller must complete mutual TLS with a certificate from the cluster CA, and only
    the orchestrator's is admitted."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"agent-{node.name}"),
        interceptors=[Admission(_orchestrator_only)] if tls else [],
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    pb_grpc.add_SandboxAgentServicer_to_server(AgentService(node), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    service_name = pb.DESCRIPTOR.services_by_name["SandboxAgent"].full_name
    health_servicer.set(service_name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        port = bind(server, listen, tls, require_client_cert=True)
    except ValueError as exc:
        raise FailedPrecondition(str(exc)) from None
    server.start()
    return server, port
