"""One node's sandboxes: a thin facade over one module per operation (`create`, `checkpoint`,
`restore`, `remove`, `verify`), each given the node's shared parts (`NodeContext`)."""

from __future__ import annotations

import signal as signals
from contextlib import suppress
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.criu.core import Criu
from sandbox_agent.errors import InvalidSpec, NotFound
from sandbox_agent.host import network
from sandbox_agent.images import oci
from sandbox_agent.images.cache import ImageCache
from sandbox_agent.node import checkpoint, create, disk, logs, remove, restore, startup, verify
from sandbox_agent.node.backends import make_backend
from sandbox_agent.node.checkpoint import SnapshotTarget
from sandbox_agent.node.context import NodeContext
from sandbox_agent.node.disk import DiskBudget
from sandbox_agent.node.identity import KEEP, Identity
from sandbox_agent.node.sandboxes import Sandboxes
from sandbox_agent.node.staging import private_dir
from sandbox_agent.node.verify import VerifierResult
from sandbox_agent.phases import PhaseHooks
from sandbox_agent.runtime.backend import Backend
from sandbox_agent.settings import AgentSettings
from sandbox_agent.spec import SandboxSpec, SandboxStatus, validate_id
from snapshots import Manifest, SnapshotNotFound, SnapshotStore


class Node:
    """The sandboxes of one node; safe to call from many gRPC threads."""

    def __init__(
        self,
        settings: AgentSettings,
        backend: Backend | None = None,
        hooks: PhaseHooks | None = None,
        store: SnapshotStore | None = None,
    ) -> None:
        """`backend` and `store` stand in for the runtime and the snapshot store the settings name."""
        name = validate_id("node", settings.node)
        if settings.stack and "." in validate_id("stack", settings.stack):
            raise InvalidSpec(
                "stack", f"{settings.stack!r} holds a dot; the node is <node>.<stack> on the host"
            )
        settings.root.mkdir(parents=True, exist_ok=True)
        backend = backend or make_backend(settings)
        if store is None and settings.snapshot_store:
            store = SnapshotStore.open(settings.snapshot_store)
        budget = DiskBudget(name, settings.disk_mb or disk.offered_mb(settings.root))
        staging = settings.root / "staging"
        staging.mkdir(exist_ok=True)
        self.ctx = NodeContext(
            name=name,
            settings=settings,
            backend=backend,
            sandboxes=Sandboxes(
                name,
                settings.host_key,
                backend,
                settings.root / "sandboxes",
                settings.run_dir / settings.host_key,
                budget,
            ),
            disk=budget,
            images=ImageCache(settings.image_cache or settings.root / "images"),
            registry=oci.RegistryAccess(
                auth_file=settings.registry_auth_file,
                certs_dir=settings.registry_certs,
                insecure=settings.insecure_registries,
                docker_host=settings.docker_url,
            ),
            store=store,
            hooks=hooks or PhaseHooks(),
            criu_version=Criu(settings.criu).version(),
            userns_base=settings.userns_base if backend.user_namespaces else 0,
            staging=staging,
            memory_staging=private_dir(settings.memory_dir, f"stasis-{settings.host_key}"),
        )
        """The node's shared parts, the one place they are held; the properties below read them."""
        self.arrivals = restore.Arrivals(
            self.ctx, lazily=settings.lazy_restore and backend.checkpoints.lazy_restore
        )
        network.prepare_node(settings.host_key, settings.allowed_ports, owns_unmarked=not settings.stack)
        startup.import_base_image(self.ctx)
        startup.recover(self.ctx)

    @property
    def name(self) -> str:
        return self.ctx.name

    @property
    def settings(self) -> AgentSettings:
        return self.ctx.settings

    @property
    def host_key(self) -> str:
        """Names what this node holds on the host (`AgentSettings.host_key`)."""
        return self.ctx.settings.host_key

    @property
    def backend(self) -> Backend:
        return self.ctx.backend

    @property
    def sandboxes(self) -> Sandboxes:
        return self.ctx.sandboxes

    @property
    def disk(self) -> DiskBudget:
        return self.ctx.disk

    @property
    def images(self) -> ImageCache:
        return self.ctx.images

    @property
    def registry(self) -> oci.RegistryAccess:
        return self.ctx.registry

    @property
    def store(self) -> SnapshotStore | None:
        return self.ctx.store

    def create(
        self, sandbox_id: str, spec: SandboxSpec, files: dict[str, bytes] | None = None
    ) -> SandboxStatus:
        validate_id("sandbox_id", sandbox_id)
        return self.sandboxes.status(create.create(self.ctx, sandbox_id, spec, files or {}))

    def checkpoint(self, sandbox_id: str, dest: Path, *, leave_running: bool) -> ckpt.CheckpointImage:
        """Freeze, dump memory and the writable layer into dest; then thaw, or stop and free the node.

        Memory and layer are captured in one freeze, so files match memory. A failed
        checkpoint leaves the sandbox running and dest absent. A fork child's held memory is let
        in first (`Arrivals.settle`).
        """
        self.arrivals.settle(sandbox_id)
        return checkpoint.checkpoint_to_dir(self.ctx, sandbox_id, dest, leave_running=leave_running)

    def checkpoint_to_store(
        self, sandbox_id: str, target: SnapshotTarget, *, leave_running: bool
    ) -> tuple[ckpt.CheckpointImage, Manifest]:
        self.arrivals.settle(sandbox_id)
        return checkpoint.checkpoint_to_store(self.ctx, sandbox_id, target, leave_running=leave_running)

    def restore(
        self,
        sandbox_id: str,
        checkpoint_dir: Path,
        *,
        image: str = "",
        verify: bool = True,
        identity: Identity = KEEP,
    ) -> SandboxStatus:
        return restore.restore_from_dir(
            self.ctx, sandbox_id, checkpoint_dir, image=image, verify=verify, identity=identity
        )

    def restore_from_store(
        self,
        sandbox_id: str,
        snapshot_id: str,
        manifest_digest: str,
        *,
        image: str = "",
        identity: Identity = KEEP,
    ) -> SandboxStatus:
        """Restore a snapshot as `identity` says: a fork child gets its own address, host name
        and fork files (`identity`)."""
        return self.arrivals.restore_from_store(
            sandbox_id, snapshot_id, manifest_digest, image=image, identity=identity
        )

    def run_verifier(
        self,
        sandbox_id: str,
        command: tuple[str, ...],
        files: dict[str, bytes],
        *,
        image: str = "",
        timeout_s: float = 600,
    ) -> VerifierResult:
        return verify.run_verifier(self.ctx, sandbox_id, command, files, image=image, timeout_s=timeout_s)

    def kill(self, sandbox_id: str, signal: int = signals.SIGKILL) -> SandboxStatus:
        return remove.kill(self.ctx, sandbox_id, signal)

    def delete(self, sandbox_id: str) -> None:
        remove.delete(self.ctx, sandbox_id)
        self.arrivals.forget(sandbox_id)

    def get(self, sandbox_id: str) -> SandboxStatus:
        return self.sandboxes.status(self.sandboxes.record(sandbox_id))

    def list(self) -> list[SandboxStatus]:
        out = []
        for sandbox_id in self.sandboxes.ids():
            try:
                out.append(self.sandboxes.status(self.sandboxes.record(sandbox_id)))
            except NotFound:
                continue  # created or deleted concurrently
        return out

    def harness_log(self, sandbox_id: str, tail_bytes: int = 65536) -> bytes:
        """The end of the harness's log (all its runs: it lives in the writable layer)."""
        return self.log_page(sandbox_id, tail_bytes)[0]

    def log_page(
        self, sandbox_id: str, tail_bytes: int = 65536, offset: int | None = None
    ) -> tuple[bytes, int]:
        """The last `tail_bytes` of the harness's log, or up to MAX_LOG_READ from `offset`; and its size."""
        record = self.sandboxes.record(sandbox_id)
        return logs.read(
            self.backend.upper_dir(record, self.sandboxes.layout(sandbox_id)), tail_bytes, offset
        )

    def snapshot_log(
        self, snapshot_id: str, tail_bytes: int = 65536, offset: int | None = None
    ) -> tuple[bytes, int]:
        """The harness's log as a committed snapshot holds it, read from the snapshot's layer:
        only the chunks of the layer under the tar headers read and under the window."""
        validate_id("snapshot_id", snapshot_id)
        try:
            layer = self.ctx.require_store().open_file(snapshot_id, ckpt.LAYER, read_ahead=False)
        except SnapshotNotFound:
            raise NotFound(f"snapshot {snapshot_id} does not exist") from None
        except FileNotFoundError:
            return b"", 0
        with layer, layer.stream() as stream:
            return logs.read_archived(stream, tail_bytes, offset)

    def warm(self) -> None:
        """Make ahead, in the background, what the first sandboxes will need (`Backend.warm`)."""
        self.backend.warm(self.ctx.userns_base)

    def close(self, timeout_s: float = 30.0) -> None:
        """Before the agent exits: wait up to `timeout_s` for memory still arriving, then remove
        each sandbox that still lacks some. Its pages would read as zeros without this agent."""
        self.arrivals.close(timeout_s)
        self.backend.close()
        if self.ctx.memory_staging is not None:
            with suppress(OSError):  # still holds a restore's files
                self.ctx.memory_staging.rmdir()

    def delete_all(self) -> None:
        """Delete every sandbox of this node: for tests and decommissioning."""
        self.close()
        for status in self.list():
            self.delete(status.record.id)
