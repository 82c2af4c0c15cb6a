"""One node's sandboxes: create, checkpoint, restore, kill and delete, with nothing left behind."""

from __future__ import annotations

import _thread
import logging
import os
import shutil
import signal as signals
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.criu import images as criu_images
from sandbox_agent.criu import lazy
from sandbox_agent.criu.core import Criu
from sandbox_agent.errors import (
    AlreadyExists,
    CheckpointCorrupt,
    FailedPrecondition,
    ImageMismatch,
    InvalidSpec,
    NotFound,
)
from sandbox_agent.host import network, overlay
from sandbox_agent.images import oci
from sandbox_agent.images.cache import Image, ImageCache
from sandbox_agent.node import disk, logs
from sandbox_agent.node.backends import make_backend
from sandbox_agent.node.disk import DiskBudget, Footprint
from sandbox_agent.node.sandboxes import Sandboxes, in_thread, partial
from sandbox_agent.node.staging import PAGES, checkpoint_shaped, private_dir, staged_bytes, staging_for
from sandbox_agent.phases import Phase, PhaseHooks, Timeline
from sandbox_agent.runtime import launch
from sandbox_agent.runtime.backend import STATE_DIR, Backend, SandboxLayout
from sandbox_agent.settings import AgentSettings
from sandbox_agent.spec import (
    SandboxRecord,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    validate_files,
    validate_id,
)
from snapshots import (
    Manifest,
    SnapshotCorrupt,
    SnapshotMeta,
    SnapshotNotFound,
    SnapshotStore,
    StoredFile,
    collector_paused,
)

log = logging.getLogger(__name__)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


CLOSE_REMOVE_S = 10.0
"""How long `close` waits for a sandbox to be removed once it stopped the sandbox's memory."""


@dataclass(frozen=True)
class VerifierResult:
    exit_code: int | None
    timed_out: bool
    log: bytes
    """Tail of the verifier's stdout and stderr."""
    duration_ms: float


@dataclass(frozen=True)
class SnapshotTarget:
    """Identity the orchestrator gives a snapshot before it exists."""

    snapshot_id: str
    episode_id: str
    sequence: int
    reason: str
    parent_id: str = ""
    trajectory_cursor: object = None


class Node:
    """The sandboxes of one node; safe to call from many gRPC threads."""

    def __init__(
        self, settings: AgentSettings, backend: Backend | None = None, hooks: PhaseHooks | None = None
    ) -> None:
        self.settings = settings
        self.hooks = hooks or PhaseHooks()
        """Called around every checkpoint and restore phase."""
        self.name = validate_id("node", settings.node)
        if settings.stack and "." in validate_id("stack", settings.stack):
            raise InvalidSpec(
                "stack", f"{settings.stack!r} holds a dot; the node is <node>.<stack> on the host"
            )
        self.host_key = settings.host_key
        """Names what this node holds on the host (`AgentSettings.host_key`)."""
        settings.root.mkdir(parents=True, exist_ok=True)
        self.images = ImageCache(settings.image_cache or settings.root / "images")
        self.registry = oci.RegistryAccess(
            auth_file=settings.registry_auth_file,
            certs_dir=settings.registry_certs,
            insecure=settings.insecure_registries,
            docker_host=settings.docker_url,
        )
        self.backend = backend or make_backend(settings)
        self.criu_version = Criu(settings.criu).version()
        self.store = SnapshotStore.open(settings.snapshot_store) if settings.snapshot_store else None
        self.disk = DiskBudget(self.name, settings.disk_mb or disk.offered_mb(settings.root))
        self.sandboxes = Sandboxes(
            self.name,
            self.host_key,
            self.backend,
            settings.root / "sandboxes",
            settings.run_dir / self.host_key,
            self.disk,
        )
        self._userns_base = settings.userns_base if self.backend.user_namespaces else 0
        """Where new sandboxes' ids start on the host; the docker backend has no user namespaces."""
        self._lazy = settings.lazy_restore and self.backend.checkpoints.lazy_restore
        """Restores from the store are lazy (`lazy`); else whole."""
        self._userfaultfd = lazy.UserfaultfdGrant()
        if self._lazy and self._userns_base:
            why = self._userfaultfd.acquire()
            if why:
                log.warning("node %s restores whole, not lazily: %s", self.name, why)
                self._lazy = False
        self._arriving: dict[str, tuple[threading.Event, lazy.Transfer]] = {}
        """Lazily restored sandboxes whose memory is still arriving, each with the event its
        waiting thread sets once it is done, and the transfer it waits for."""
        self._eager_next: set[str] = set()
        """Snapshots whose lazy restore met a damaged chunk here: the next try fetches them
        whole, so it fails outright, as the control plane expects of a damaged snapshot."""
        self._staging = settings.root / "staging"
        self._staging.mkdir(exist_ok=True)
        self._memory_staging = private_dir(settings.memory_dir, f"stasis-{self.host_key}")
        self._lock = threading.Lock()
        """Guards `_arriving` and `_eager_next`."""
        network.prepare_node(self.host_key, settings.allowed_ports, owns_unmarked=not settings.stack)
        self._import_base_image()
        self._recover()
        # Whatever a crash left half-written here is garbage now (recovery took what it needed);
        # committed checkpoints live elsewhere.
        for staging in (self._staging, self._memory_staging):
            for leftover in staging.iterdir() if staging is not None else ():
                shutil.rmtree(leftover, ignore_errors=True)

    # -- start-up ---------------------------------------------------------------------------

    def _import_base_image(self) -> None:
        tar = self.settings.base_image_tar
        if tar is None:
            return
        with self.images.importing():
            try:
                self.images.resolve("base")
            except NotFound:
                if tar.is_file():
                    image = self.images.import_tarball(tar, name="base")
                    log.info("node %s imported base image %s", self.name, image.digest)

    def _recover(self) -> None:
        """After a crash: drop half-made sandboxes and containers that have no record, and finish
        or undo what an operation left half done."""
        known, unrecorded = self.sandboxes.recover()
        leftovers = self.backend.remove_leftovers(known)
        for leftover in leftovers:
            log.warning("node %s removed container %s that had no record", self.name, leftover)
        if self.backend.wants_netns:
            # Its tasks are gone; its netns, veth and route would keep its address taken.
            for sandbox_id in sorted({*leftovers, *unrecorded}):
                network.reclaim(self.host_key, sandbox_id)
        for sandbox_id in known:
            record, layout = self.sandboxes.record(sandbox_id), self.sandboxes.layout(sandbox_id)
            if layout.arriving.exists():
                # Its agent died while the sandbox's memory was still arriving: pages it never
                # got would read as zeros. Its snapshot is intact; the control plane restores
                # it again once it finds it gone.
                log.warning(
                    "node %s removes sandbox %s: its lazy restore ended with this agent",
                    self.name,
                    sandbox_id,
                )
                self._remove_now(record, layout)
                continue
            state = self.backend.status(record, layout)[0]
            if layout.stopped.exists() and state == SandboxState.EXITED:
                # Its agent died between the kill and the commit: the snapshot never landed.
                images = Path(layout.stopped.read_text())
                self._revive(record, layout, images)
                if images.name == ckpt.CRIU_DIR and images.parent.name.startswith(partial(sandbox_id)):
                    shutil.rmtree(images.parent, ignore_errors=True)
                continue
            # A stopping dump that never finished: the sandbox runs on, and its mark goes.
            layout.stopped.unlink(missing_ok=True)
            if state == SandboxState.PAUSED:
                # Only a checkpoint freezes a sandbox; this one's agent died before it thawed.
                self.backend.thaw(record, layout)
                log.warning(
                    "node %s thawed sandbox %s left frozen by an interrupted checkpoint",
                    self.name,
                    sandbox_id,
                )

    # -- operations -------------------------------------------------------------------------

    def create(
        self, sandbox_id: str, spec: SandboxSpec, files: dict[str, bytes] | None = None
    ) -> SandboxStatus:
        validate_id("sandbox_id", sandbox_id)
        return self.sandboxes.status(self._start(sandbox_id, spec, files or {}))

    def _start(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        files: dict[str, bytes],
        graded: Path | None = None,
    ) -> SandboxRecord:
        """Validate, build and start a fresh sandbox; nothing of it remains if any step fails."""
        spec = spec.validated()
        files = validate_files(files)
        timeline = Timeline(sandbox_id, self.hooks)
        image = self._image(spec.image, timeline)
        spec = replace(launch.effective(spec, image), userns_base=self._userns_base).validated()
        record = SandboxRecord(
            id=sandbox_id,
            node=self.name,
            backend=self.backend.name,
            spec=spec,
            image_digest=image.digest,
            created_at=time.time(),
            timings_ms=timeline.timings_ms(),
        )
        with self.sandboxes.new(sandbox_id, record) as layout:
            self.backend.create(record, layout, image, files, graded)
            self.backend.start(record, layout)
        return record

    def _image(self, ref: str, timeline: Timeline) -> Image:
        """The cached image, or one pulled now if the reference names a source this node can
        reach (the pull is timed as its own phase)."""
        try:
            return self.images.resolve(ref)
        except NotFound:
            if not oci.is_pullable(ref):
                raise
        with timeline.phase(Phase.PULL):
            return self.images.pull(ref, self.registry)

    def checkpoint(self, sandbox_id: str, dest: Path, *, leave_running: bool) -> ckpt.Checkpoint:
        """Freeze, dump memory and the writable layer into dest; then thaw, or stop and free the node.

        Memory and layer are captured in one freeze, so files match memory. A failed
        checkpoint leaves the sandbox running and dest absent.
        """
        if dest.exists():
            raise AlreadyExists(f"checkpoint destination {dest} already exists")
        timeline = Timeline(sandbox_id, self.hooks)
        with self._captured(
            sandbox_id, dest.parent, timeline, leave_running=leave_running, hash_files=True
        ) as captured:
            os.rename(captured.directory, dest)
        return replace(captured, directory=dest, timings_ms=timeline.timings_ms())

    def checkpoint_to_store(
        self, sandbox_id: str, target: SnapshotTarget, *, leave_running: bool
    ) -> tuple[ckpt.Checkpoint, Manifest]:
        """Checkpoint into the snapshot store. When stopping, the sandbox is killed once dumped and
        the upload follows; a failed upload revives it from the local images rather than lose it."""
        store = self._require_store()
        timeline = Timeline(sandbox_id, self.hooks)
        # The store hashes every chunk, so the checkpoint's own file hashes would be redundant work.
        with (
            self._captured(
                sandbox_id, self._staging, timeline, leave_running=leave_running, hash_files=False
            ) as captured,
            timeline.phase(Phase.PUT),
        ):
            manifest = store.put(
                captured.directory,
                SnapshotMeta(
                    snapshot_id=target.snapshot_id,
                    episode_id=target.episode_id,
                    seq=target.sequence,
                    parent_id=target.parent_id or None,
                    node=self.name,
                    reason=target.reason,
                    created_at=datetime.fromtimestamp(captured.created_at, UTC),
                    image_digest=captured.image_digest,
                    runtime_backend=captured.backend,
                    criu_version=captured.criu_version,
                    trajectory_cursor=target.trajectory_cursor,
                    timings_ms=captured.timings_ms,
                ),
                aligner=lazy.align_memory,
            )
        # The manifest keeps what was known at commit; the reply adds the put itself.
        timeline.add(dict(manifest.timings_ms))
        return replace(captured, timings_ms=timeline.timings_ms()), manifest

    @contextmanager
    def _captured(
        self, sandbox_id: str, parent: Path, timeline: Timeline, *, leave_running: bool, hash_files: bool
    ) -> Iterator[ckpt.Checkpoint]:
        """Capture memory and layer in one freeze and yield the sealed checkpoint in a staging dir.

        The body commits it somewhere. With leave_running the sandbox is thawed once its layer is
        archived. Without, it is killed as soon as its memory is dumped, which frees the node
        before the slow part (layer, hashing, upload); it is removed once the body has committed.
        If anything fails, the sandbox keeps running: thawed, or revived from the images.
        """
        record = self.sandboxes.record(sandbox_id)
        with self.sandboxes.exclusive(sandbox_id):
            layout = self.sandboxes.layout(sandbox_id)
            state, _ = self.backend.status(record, layout)
            if state != SandboxState.RUNNING:
                raise FailedPrecondition(
                    f"sandbox {sandbox_id!r} on node {self.name} is {state}, not running"
                )
            parent.mkdir(parents=True, exist_ok=True)
            staging = parent / f"{partial(sandbox_id)}{uuid.uuid4().hex[:8]}"
            need = Footprint.of(record.spec.resources).staging_mb
            with self.disk.staging(sandbox_id, need, "checkpoint", disk.STAGING_WAIT_S):
                staging.mkdir()
                images = staging / ckpt.CRIU_DIR
                frozen = False
                stopped = False
                try:
                    frozen_wall = time.time()
                    began = time.monotonic()
                    if leave_running:
                        with timeline.phase(Phase.FREEZE):
                            self.backend.freeze(record, layout)
                        frozen = True
                        with timeline.phase(Phase.DUMP):
                            self.backend.checkpoints.dump(record, layout, images)
                    else:
                        # Stopping: the processes go as soon as their memory is written. The layer
                        # can wait, since nothing writes to it once they are gone; if anything
                        # after this fails, they are revived from these images. The mark goes
                        # first, so an agent that dies once they are gone still revives them.
                        layout.stopped.write_text(str(images))
                        try:
                            with timeline.phase(Phase.DUMP):
                                frozen_ms = self.backend.checkpoints.dump_and_stop(record, layout, images)
                        except BaseException:
                            layout.stopped.unlink(missing_ok=True)  # it runs on, as it was
                            raise
                        stopped = True
                        free_ms = (time.monotonic() - began) * 1000
                        # Frozen for part of the dump, where CRIU says how long; else for all of it.
                        timeline.measured(
                            Phase.FROZEN, free_ms if frozen_ms is None else min(frozen_ms, free_ms)
                        )
                        timeline.measured(Phase.NODE_FREE, free_ms)
                    with timeline.phase(Phase.LAYER):
                        upper = self.backend.upper_dir(record, layout)
                        layer_bytes = overlay.export_layer(upper, staging / ckpt.LAYER, first=STATE_DIR)
                        log_bytes = logs.read(upper, 0, None)[1]
                    if leave_running:
                        self.backend.thaw(record, layout)
                        frozen = False
                        timeline.record(Phase.FROZEN, began)
                    captured = ckpt.seal(
                        ckpt.Checkpoint(
                            sandbox_id=sandbox_id,
                            node=self.name,
                            backend=self.backend.name,
                            spec=record.spec,
                            image_digest=record.image_digest,
                            criu_version=self.criu_version,
                            # The instant the state is of: what the harness had done when it froze.
                            created_at=frozen_wall,
                            leave_running=leave_running,
                            timings_ms=timeline.timings_ms(),
                            sizes=ckpt.Sizes(
                                criu_bytes=sum(p.stat().st_size for p in (staging / ckpt.CRIU_DIR).iterdir()),
                                layer_bytes=layer_bytes,
                                log_bytes=log_bytes,
                            ),
                            oci_spec=self.backend.oci_spec(record, layout),
                            directory=staging,
                        ),
                        hash_files=hash_files,
                    )
                    yield captured
                    timeline.record(Phase.DURABLE, began)
                except BaseException:
                    if frozen:
                        self.backend.thaw(record, layout)
                    elif stopped:
                        self._revive(record, layout, images)
                    raise
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            if not leave_running:
                self.sandboxes.teardown(record, layout)

    def _revive(self, record: SandboxRecord, layout: SandboxLayout, images: Path) -> None:
        """Bring back a sandbox stopped for a checkpoint that then failed. If that fails too, the
        sandbox is removed, and the orchestrator resumes the episode from its last snapshot."""
        try:
            self.backend.checkpoints.revive(record, layout, images)
        except Exception:
            log.exception("node %s could not revive sandbox %s; removing it", self.name, record.id)
            self.sandboxes.teardown(record, layout)
            return
        layout.stopped.unlink(missing_ok=True)
        log.warning("node %s revived sandbox %s after its checkpoint failed", self.name, record.id)

    def _require_store(self) -> SnapshotStore:
        if self.store is None:
            raise FailedPrecondition(f"node {self.name} has no snapshot store configured (--snapshot-store)")
        return self.store

    def restore_from_store(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, *, image: str = ""
    ) -> SandboxStatus:
        """Fetch a snapshot and restore it on this node: lazily where the backend can, else whole.
        The sandbox's network and its writable layer's disk are made while the snapshot's files
        arrive.

        Anyone who can write to the store could put any manifest there, and CRIU restores the
        credentials, capabilities and seccomp its images hold: so the stored manifest is checked
        against `manifest_digest`, the one the orchestrator recorded when the snapshot was taken,
        before anything of it is parsed (ManifestMismatch, naming the snapshot), and everything
        the restore reads (checkpoint.json, CRIU's images, the layer) is reached through it,
        every chunk checked against its hash. A restore given no digest is refused.

        A lazy restore leaves the pages files in the store: it writes the pages CRIU restores
        itself and resumes the sandbox; the rest of its memory arrives as it runs
        (`lazy.Transfer`). Until every page is in, the sandbox stays busy (no checkpoint
        meanwhile), and a page that cannot be had removes it.

        Until the sandbox runs, Python's cyclic collector is held off (`collector_paused`): the
        restore allocates enough to set a collection off, which walks every object the agent made
        since it started (`set_aside_startup_objects`)."""
        if not manifest_digest:
            raise FailedPrecondition(
                f"restore of snapshot {snapshot_id} names no manifest digest; node {self.name} "
                "restores only a snapshot whose manifest the orchestrator recorded"
            )
        with collector_paused():
            return self._restore_from_store(sandbox_id, snapshot_id, manifest_digest, image)

    def _restore_from_store(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, image: str
    ) -> SandboxStatus:
        store = self._require_store()
        if self.sandboxes.layout(sandbox_id).dir.exists():  # layout() checks the id
            raise AlreadyExists(f"sandbox {sandbox_id!r} already exists on node {self.name}")
        staged_as = f"restore-{sandbox_id}-{uuid.uuid4().hex[:8]}"
        staging = self._staging / staged_as
        timeline = Timeline(sandbox_id, self.hooks)
        lazily = self._lazy and snapshot_id not in self._eager_next
        leave_out: Callable[[str], object] = PAGES.fullmatch if lazily else lambda path: False
        reader = store.reader(snapshot_id, manifest_digest)

        def images(name: str) -> StoredFile:
            return reader.open(f"{ckpt.CRIU_DIR}/{name}")

        head: Future[ckpt.Checkpoint] = Future()
        tree: Future[None] = Future()
        room = ExitStack()
        """The disk held for the files staged on it, until they are removed."""

        def fetch() -> dict[int, lazy.Memory]:
            """The snapshot's metadata (`head`), then its tree (`tree`), then, for a lazy
            restore, the pages CRIU restores itself, while the restore rebuilds the layer."""
            nonlocal staging
            try:
                with timeline.phase(Phase.FETCH):
                    checkpoint_shaped(reader.manifest)
                    metadata = reader.open(ckpt.METADATA)
                    raw = metadata.read(0, metadata.size)
                    head.set_result(ckpt.parse(raw, f"{snapshot_id}:{ckpt.METADATA}"))
                    where = staging_for(reader.manifest, leave_out, self._staging, self._memory_staging)
                    staging = where / staged_as
                    if where == self._staging:
                        need = -(-staged_bytes(reader.manifest, leave_out) >> 20)
                        room.enter_context(
                            self.disk.staging(sandbox_id, need, "restore", disk.STAGING_WAIT_S)
                        )
                    reader.fetch(staging, leave_out=leave_out)
                    tree.set_result(None)
                    return lazy.prepare(staging / ckpt.CRIU_DIR, images) if lazily else {}
            except BaseException as exc:
                for future in (head, tree):
                    if not future.done():
                        future.set_exception(exc)
                raise

        fetching = in_thread(fetch, f"fetch-{sandbox_id}")

        def fetched() -> tuple[ckpt.Checkpoint, lazy.Transfer | None]:
            tree.result()
            # Every chunk was verified as it was fetched; the directory needs no second pass.
            with timeline.phase(Phase.VERIFY):
                checkpoint = ckpt.load(staging, verify=False)
                if problem := self._foreign_user_namespace(checkpoint):
                    raise SnapshotCorrupt(snapshot_id, ckpt.CRIU_DIR, None, problem)
            if not lazily:
                return checkpoint, None
            return checkpoint, lazy.Transfer(fetching, images, fault=lambda _: self._stop_quietly(sandbox_id))

        def release() -> None:
            wait([fetching])  # its files are not removed under it
            reader.close()
            shutil.rmtree(staging, ignore_errors=True)
            room.close()

        try:
            status, transfer = self._restore(
                sandbox_id, head.result(), timeline, image=image, source=snapshot_id, fetched=fetched,
                keep_busy=lazily,
            )  # fmt: skip
        except BaseException:
            release()
            raise
        if transfer is None:
            release()
            return status
        layout = self.sandboxes.layout(sandbox_id)
        if transfer.failure is not None:  # failed while the restore was finishing
            self._memory_arrives(sandbox_id, snapshot_id, layout, transfer, timeline, release)
            raise transfer.failure
        arrived = threading.Event()
        with self._lock:
            self._arriving[sandbox_id] = (arrived, transfer)
        # `_thread`'s start, unlike `Thread.start`, does not wait for the new thread to run: with
        # the memory arriving on both cores, that wait took 0-6 ms of every lazy restore.
        _thread.start_new_thread(
            self._memory_arrives, (sandbox_id, snapshot_id, layout, transfer, timeline, release)
        )
        return status

    def _memory_arrives(
        self,
        sandbox_id: str,
        snapshot_id: str,
        layout: SandboxLayout,
        transfer: lazy.Transfer,
        timeline: Timeline,
        release: Callable[[], None],
    ) -> None:
        """Wait for the rest of a lazily restored sandbox's memory; remove the sandbox if any of
        it could not be had. Either way, then set the sandbox's event in `_arriving`, if any."""
        try:
            try:
                error = transfer.wait()
            finally:
                release()
            if error:
                log.error("node %s removes sandbox %s: %s", self.name, sandbox_id, error)
                if isinstance(transfer.failure, SnapshotCorrupt):
                    with self._lock:
                        self._eager_next.add(snapshot_id)
                with suppress(NotFound):
                    self._remove_now(self.sandboxes.record(sandbox_id), layout)
            else:
                try:
                    record = self.sandboxes.record(sandbox_id)
                    resident = timeline.record(Phase.RESIDENT, timeline.started)
                    record.timings_ms = {**record.timings_ms, Phase.RESIDENT.key: resident}
                    record.save(layout.record)
                except NotFound:
                    pass
        finally:
            layout.arriving.unlink(missing_ok=True)
            with self._lock:
                arriving = self._arriving.pop(sandbox_id, None)
            self.sandboxes.done(sandbox_id)
            if arriving is not None:
                arriving[0].set()

    def _remove_now(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        """Kill a sandbox's processes and remove everything of it on the node. `delete` calls it
        in the sandbox's turn; a sandbox that lacks memory it cannot get is removed so whatever
        it is busy with, and the control plane, finding it gone, restores it again."""
        self.backend.kill(record, layout, signals.SIGKILL)
        self.sandboxes.teardown(record, layout)

    def warm(self) -> None:
        """Make ahead, in the background, what the first sandboxes will need (`Backend.warm`)."""
        self.backend.warm(self._userns_base)

    def close(self, timeout_s: float = 30.0) -> None:
        """Before the agent exits: wait up to `timeout_s` for memory still arriving, then remove
        each sandbox that still lacks some. Its pages would read as zeros without this agent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            arriving = dict(self._arriving)
        for arrived, _ in arriving.values():
            arrived.wait(max(0.0, deadline - time.monotonic()))
        late = {sandbox_id: pair for sandbox_id, pair in arriving.items() if not pair[0].is_set()}
        for sandbox_id, (_, transfer) in late.items():
            # Stopping its transfer fails the memory's wait, which removes the sandbox: nothing
            # of the restore outlives the agent.
            log.warning("node %s removes sandbox %s: its memory is still arriving", self.name, sandbox_id)
            self._stop_arriving(sandbox_id, transfer)
        deadline = time.monotonic() + CLOSE_REMOVE_S
        for sandbox_id, (arrived, _) in late.items():
            if not arrived.wait(max(0.0, deadline - time.monotonic())):
                with suppress(NotFound):
                    self._remove_now(self.sandboxes.record(sandbox_id), self.sandboxes.layout(sandbox_id))
        self.backend.close()
        self._userfaultfd.release()
        if self._memory_staging is not None:
            with suppress(OSError):  # still holds a restore's files
                self._memory_staging.rmdir()

    def _stop_quietly(self, sandbox_id: str) -> None:
        """Kill a sandbox's processes at once, whatever it is busy with (a lazy restore's fault)."""
        try:
            record = self.sandboxes.record(sandbox_id)
        except NotFound:
            return
        self.backend.kill(record, self.sandboxes.layout(sandbox_id), signals.SIGKILL)

    def _stop_arriving(self, sandbox_id: str, transfer: lazy.Transfer) -> None:
        """Kill a running sandbox whose memory is still arriving, then stop its transfer (CRIU's
        daemon and the page server): killed first, it never runs on a page it lacks."""
        self._stop_quietly(sandbox_id)
        transfer.abort()

    def restore(
        self, sandbox_id: str, checkpoint_dir: Path, *, image: str = "", verify: bool = True
    ) -> SandboxStatus:
        """Start a new sandbox from a checkpoint directory, on this node, under a new id if need be."""
        validate_id("sandbox_id", sandbox_id)
        timeline = Timeline(sandbox_id, self.hooks)
        with timeline.phase(Phase.VERIFY):
            checkpoint = ckpt.load(checkpoint_dir, verify=verify)
            if problem := self._foreign_user_namespace(checkpoint):
                raise CheckpointCorrupt(f"checkpoint {checkpoint_dir}: {problem}")
        status, _ = self._restore(
            sandbox_id, checkpoint, timeline, image=image, source=str(checkpoint_dir),
            fetched=lambda: (checkpoint, None),
        )  # fmt: skip
        return status

    def _foreign_user_namespace(self, checkpoint: ckpt.Checkpoint) -> str:
        """Why CRIU would not restore these tasks as a sandbox's, unprivileged on this node (the
        images, which the node that took them wrote, decide the user namespace); "" if it would."""
        if not self._userns_base:
            return ""
        problem = criu_images.user_namespace_problem(checkpoint.directory / ckpt.CRIU_DIR, self._userns_base)
        return f"its images would not restore as a sandbox's: {problem}" if problem else ""

    def _restore(
        self,
        sandbox_id: str,
        head: ckpt.Checkpoint,
        timeline: Timeline,
        *,
        image: str,
        source: str,
        fetched: Callable[[], tuple[ckpt.Checkpoint, lazy.Transfer | None]],
        keep_busy: bool = False,
    ) -> tuple[SandboxStatus, lazy.Transfer | None]:
        """Restore the sandbox whose checkpoint `head` describes. Its network and writable layer's
        disk are made first; then `fetched()` gives the checkpoint whole (once its files are
        here) and, for a lazy restore, the transfer of its memory."""
        local = self._restore_image(head, image, timeline)
        if head.backend != self.backend.name:
            raise FailedPrecondition(
                f"checkpoint {source} was taken by the {head.backend} backend; "
                f"node {self.name} runs {self.backend.name}"
            )
        record = SandboxRecord(
            id=sandbox_id,
            node=self.name,
            backend=self.backend.name,
            spec=head.spec,
            image_digest=local.digest,
            created_at=time.time(),
            restored_from=source,
        )
        with self.sandboxes.new(
            sandbox_id,
            record,
            keep_busy=keep_busy,
            alongside=lambda layout: self.backend.checkpoints.prepare_restore(record, layout),
        ) as layout:
            checkpoint, transfer = fetched()
            if transfer is not None:
                layout.arriving.touch()
            with timeline.phase(Phase.RESTORE):
                pid = self.backend.checkpoints.restore(record, layout, local, checkpoint, transfer)
            try:
                record.timings_ms = timeline.timings_ms()
                # What the restored process writes from its first instant on belongs to this
                # run. (Checkpoints older than `log_bytes` are measured now, a little late.)
                record.log_start = (
                    checkpoint.sizes.log_bytes
                    or logs.read(self.backend.upper_dir(record, layout), 0, None)[1]
                )
                record.save(layout.record)
            except BaseException:
                if transfer is not None:
                    self._stop_arriving(sandbox_id, transfer)
                raise
        # Running as of the restore's return; asking the runtime again would only cost time.
        status = SandboxStatus(record=record, state=SandboxState.RUNNING, pid=pid, busy=keep_busy)
        return status, transfer

    def _restore_image(self, checkpoint: ckpt.Checkpoint, image: str, timeline: Timeline) -> Image:
        ref = image or checkpoint.spec.image
        if self.images.has(checkpoint.image_digest) and not image:
            return self.images.resolve(checkpoint.image_digest)
        try:
            local = self._image(ref, timeline)
        except NotFound:
            if self.images.has(checkpoint.image_digest):
                return self.images.resolve(checkpoint.image_digest)
            raise
        if local.digest != checkpoint.image_digest:
            raise ImageMismatch(checkpoint.image_digest, local.digest, ref)
        return local

    def run_verifier(
        self,
        sandbox_id: str,
        command: tuple[str, ...],
        files: dict[str, bytes],
        *,
        image: str = "",
        timeout_s: float = 600,
    ) -> VerifierResult:
        """Run a grading command in a fresh sandbox that sees an exited sandbox's final tree.

        The verifier's root is a trusted image alone: `image` (the reward image) or the graded
        episode's own image, pristine. Every program, library and interpreter it runs comes from
        there. The harness's final tree (its writable layer over its image) is mounted at
        GRADED_MOUNT read-only and noexec: data the grader reads, never on its PATH. The
        verifier's own files (hidden tests, reference answers) never existed in the graded
        sandbox, and it has no network.
        """
        record = self.sandboxes.record(sandbox_id)
        if not self.backend.runs_verifiers:
            raise FailedPrecondition(
                f"node {self.name} runs {self.backend.name}; verifiers need the runc backend"
            )
        if not 0 < timeout_s <= MAX_VERIFIER_S:  # NaN fails too
            raise InvalidSpec("timeout_s", f"{timeout_s} must be > 0 and <= {MAX_VERIFIER_S}")
        verifier_id = f"{sandbox_id}-verify"
        with self.sandboxes.exclusive(sandbox_id):
            layout = self.sandboxes.layout(sandbox_id)
            state, _ = self.backend.status(record, layout)
            if state != SandboxState.EXITED:
                raise FailedPrecondition(
                    f"sandbox {sandbox_id!r} is {state}; a verifier runs after the harness exits"
                )
            # The graded layer must not be an upper dir of a live mount while it is a lower one.
            self.backend.destroy(record, layout)
            graded = self.backend.mount_graded(
                layout, self.images.resolve(record.image_digest), self._userns_base
            )
            spec = SandboxSpec(
                image=image or record.image_digest,
                command=command,
                entrypoint=(),  # the command runs as given, whatever the image's entrypoint
                hostname="verifier",
                resources=record.spec.resources,
            )
            started = time.monotonic()
            with ExitStack() as cleanup:  # last in, first out: the verifier, then the graded view
                cleanup.callback(overlay.unmount_below, layout.mapped)
                cleanup.callback(overlay.unmount, graded)
                vrecord = self._start(verifier_id, spec, files, graded=graded)
                cleanup.callback(self.sandboxes.teardown, vrecord, self.sandboxes.layout(verifier_id))
                status = self.sandboxes.status(vrecord)
                while status.state != SandboxState.EXITED and time.monotonic() - started < timeout_s:
                    time.sleep(0.1)
                    status = self.sandboxes.status(vrecord)
                timed_out = status.state != SandboxState.EXITED
                if timed_out:
                    self.backend.kill(vrecord, self.sandboxes.layout(verifier_id), signals.SIGKILL)
                    status = self.sandboxes.status(vrecord)
                return VerifierResult(
                    exit_code=status.exit_code,
                    timed_out=timed_out,
                    log=self.harness_log(verifier_id),
                    duration_ms=_ms(time.monotonic() - started),
                )

    def kill(self, sandbox_id: str, signal: int = signals.SIGKILL) -> SandboxStatus:
        if signal not in signals.valid_signals() or signal == 0:
            raise InvalidSpec("signal", f"{signal} is not a signal number")
        record = self.sandboxes.record(sandbox_id)
        with self.sandboxes.exclusive(sandbox_id):
            self.backend.kill(record, self.sandboxes.layout(sandbox_id), signal)
        return self.sandboxes.status(record)

    def delete(self, sandbox_id: str) -> None:
        record = self.sandboxes.record(sandbox_id)
        with self.sandboxes.exclusive(sandbox_id):
            self._remove_now(record, self.sandboxes.layout(sandbox_id))

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
            layer = self._require_store().open_file(snapshot_id, ckpt.LAYER, read_ahead=False)
        except SnapshotNotFound:
            raise NotFound(f"snapshot {snapshot_id} does not exist") from None
        except FileNotFoundError:
            return b"", 0
        with layer, layer.stream() as stream:
            return logs.read_archived(stream, tail_bytes, offset)

    def delete_all(self) -> None:
        """Delete every sandbox of this node: for tests and decommissioning."""
        self.close()
        for status in self.list():
            self.delete(status.record.id)


MAX_VERIFIER_S = 30 * 86400
"""The longest a verifier may be given: an infinite one would hold the sandbox and a worker forever."""
