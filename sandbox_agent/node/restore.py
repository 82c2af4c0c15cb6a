"""Restore: start a sandbox from a checkpoint directory, or from a snapshot in the store, where
its memory may arrive lazily while it runs (`Arrivals`).

The sandbox's network and its writable layer's disk are made while the snapshot's files arrive.
"""

from __future__ import annotations

import _thread
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import ExitStack, suppress
from dataclasses import replace
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.criu import images as criu_images
from sandbox_agent.criu import lazy, pagemap
from sandbox_agent.criu.userfaultfd import UserfaultfdGrant
from sandbox_agent.errors import (
    AlreadyExists,
    Busy,
    CheckpointCorrupt,
    FailedPrecondition,
    ImageMismatch,
    InvalidSpec,
    NotFound,
)
from sandbox_agent.images.cache import Image
from sandbox_agent.node import disk, logs
from sandbox_agent.node.context import NodeContext
from sandbox_agent.node.create import resolve_image
from sandbox_agent.node.identity import KEEP, Identity, fork_files
from sandbox_agent.node.remove import remove_now, stop_quietly
from sandbox_agent.node.sandboxes import in_thread
from sandbox_agent.node.staging import PAGES, checkpoint_shaped, staged_bytes, staging_for
from sandbox_agent.phases import Phase, Timeline
from sandbox_agent.runtime.backend import SandboxLayout
from sandbox_agent.spec import SandboxRecord, SandboxState, SandboxStatus, validate_id
from snapshots import SnapshotCorrupt, StoredFile, collector_paused

log = logging.getLogger(__name__)

SETTLE_S = 120.0
"""How long a checkpoint waits for a held sandbox's memory once it released it."""
CLOSE_REMOVE_S = 10.0
"""How long `close` waits for a sandbox to be removed once it stopped the sandbox's memory."""

Fetched = Callable[[], tuple[ckpt.CheckpointImage, lazy.Transfer | None]]
"""Gives the checkpoint whole once its files are here and, for a lazy restore, its memory's transfer."""


def restore_from_dir(
    ctx: NodeContext,
    sandbox_id: str,
    checkpoint_dir: Path,
    *,
    image: str = "",
    verify: bool = True,
    identity: Identity = KEEP,
) -> SandboxStatus:
    """Start a new sandbox from a checkpoint directory, on this node, under a new id if need be,
    as `identity` says."""
    validate_id("sandbox_id", sandbox_id)
    identity.validated()
    timeline = Timeline(sandbox_id, ctx.hooks)
    with timeline.phase(Phase.VERIFY):
        checkpoint = ckpt.load(checkpoint_dir, verify=verify)
        if problem := _foreign_user_namespace(ctx, checkpoint):
            raise CheckpointCorrupt(f"checkpoint {checkpoint_dir}: {problem}")
    if not identity.hostname or identity.hostname == checkpoint.spec.hostname:
        own = None
    else:  # the restore renames the host in its images: in a copy of its own, not the caller's
        own = ctx.staging / f"restore-{sandbox_id}-{uuid.uuid4().hex[:8]}"
        shutil.copytree(checkpoint_dir, own, copy_function=_link_or_copy)
    try:
        status, _ = _restore(
            ctx, sandbox_id, checkpoint, timeline, image=image, source=str(checkpoint_dir),
            fetched=lambda: (replace(checkpoint, directory=own or checkpoint.directory), None),
            identity=identity,
        )  # fmt: skip
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
    return status


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)


class Arrivals:
    """Lazily restored sandboxes of one node whose memory is still arriving; and the restores
    from the store, which start them."""

    def __init__(self, ctx: NodeContext, *, lazily: bool) -> None:
        self.ctx = ctx
        self.lazily = lazily
        """Restores from the store are lazy (`lazy`); else whole."""
        self.userfaultfd = UserfaultfdGrant()
        if self.lazily and ctx.userns_base:
            why = self.userfaultfd.acquire()
            if why:
                log.warning("node %s restores whole, not lazily: %s", ctx.name, why)
                self.lazily = False
        self._arriving: dict[str, tuple[threading.Event, lazy.Transfer]] = {}
        """Sandboxes whose memory is still arriving, each with the event its waiting thread sets
        once it is done, and the transfer it waits for."""
        self._eager_next: set[str] = set()
        """Snapshots whose lazy restore met a damaged chunk here: the next try fetches them
        whole, so it fails outright, as the control plane expects of a damaged snapshot."""
        self._lock = threading.Lock()
        """Guards `_arriving` and `_eager_next`."""

    def restore_from_store(
        self,
        sandbox_id: str,
        snapshot_id: str,
        manifest_digest: str,
        *,
        image: str = "",
        identity: Identity = KEEP,
    ) -> SandboxStatus:
        """Fetch a snapshot and restore it on this node: lazily where the backend can, else whole;
        as `identity` says (a fork child of the snapshot's episode gets its own address, host
        name and fork files), which is checked before anything is fetched.

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

        A fork child's memory is held (`lazy.Transfer(hold=True)`): only the pages it touches
        arrive, so a fork's idle children hold what they use, not the parent's memory each. It is
        not busy meanwhile; a checkpoint first lets the rest arrive (`settle`).

        Until the sandbox runs, Python's cyclic collector is held off (`collector_paused`): the
        restore allocates enough to set a collection off, which walks every object the agent made
        since it started (`set_aside_startup_objects`)."""
        identity.validated()
        if identity.fork is not None and identity.fork.snapshot_id != snapshot_id:
            raise InvalidSpec(
                "fork.snapshot_id",
                f"{identity.fork.snapshot_id!r} is not the snapshot restored, {snapshot_id!r}",
            )
        if not manifest_digest:
            raise FailedPrecondition(
                f"restore of snapshot {snapshot_id} names no manifest digest; node {self.ctx.name} "
                "restores only a snapshot whose manifest the orchestrator recorded"
            )
        with collector_paused():
            return self._restore_from_store(sandbox_id, snapshot_id, manifest_digest, image, identity)

    def _restore_from_store(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, image: str, identity: Identity
    ) -> SandboxStatus:
        ctx = self.ctx
        store = ctx.require_store()
        if ctx.sandboxes.layout(sandbox_id).dir.exists():  # layout() checks the id
            raise AlreadyExists(f"sandbox {sandbox_id!r} already exists on node {ctx.name}")
        staged_as = f"restore-{sandbox_id}-{uuid.uuid4().hex[:8]}"
        staging = ctx.staging / staged_as
        timeline = Timeline(sandbox_id, ctx.hooks)
        with self._lock:
            lazily = self.lazily and snapshot_id not in self._eager_next
        held = lazily and identity.fork is not None
        leave_out: Callable[[str], object] = PAGES.fullmatch if lazily else lambda path: False
        reader = store.reader(snapshot_id, manifest_digest)

        def images(name: str) -> StoredFile:
            return reader.open(f"{ckpt.CRIU_DIR}/{name}")

        head: Future[ckpt.CheckpointImage] = Future()
        tree: Future[None] = Future()
        room = ExitStack()
        """The disk held for the files staged on it, until they are removed."""

        def fetch() -> dict[int, pagemap.Memory]:
            """The snapshot's metadata (`head`), then its tree (`tree`), then, for a lazy
            restore, the pages CRIU restores itself, while the restore rebuilds the layer."""
            nonlocal staging
            try:
                with timeline.phase(Phase.FETCH):
                    checkpoint_shaped(reader.manifest)
                    metadata = reader.open(ckpt.METADATA)
                    raw = metadata.read(0, metadata.size)
                    head.set_result(ckpt.parse(raw, f"{snapshot_id}:{ckpt.METADATA}"))
                    where = staging_for(reader.manifest, leave_out, ctx.staging, ctx.memory_staging)
                    staging = where / staged_as
                    if where == ctx.staging:
                        need = -(-staged_bytes(reader.manifest, leave_out) >> 20)
                        room.enter_context(ctx.disk.staging(sandbox_id, need, "restore", disk.STAGING_WAIT_S))
                    reader.fetch(staging, leave_out=leave_out)
                    tree.set_result(None)
                    return lazy.prepare(staging / ckpt.CRIU_DIR, images) if lazily else {}
            except BaseException as exc:
                for future in (head, tree):
                    if not future.done():
                        future.set_exception(exc)
                raise

        fetching = in_thread(fetch, f"fetch-{sandbox_id}")

        def fetched() -> tuple[ckpt.CheckpointImage, lazy.Transfer | None]:
            tree.result()
            # Every chunk was verified as it was fetched; the directory needs no second pass.
            with timeline.phase(Phase.VERIFY):
                checkpoint = ckpt.load(staging, verify=False)
                if problem := _foreign_user_namespace(ctx, checkpoint):
                    raise SnapshotCorrupt(snapshot_id, ckpt.CRIU_DIR, None, problem)
            if not lazily:
                return checkpoint, None
            return checkpoint, lazy.Transfer(
                fetching, images, fault=lambda _: stop_quietly(ctx, sandbox_id), hold=held
            )

        def release() -> None:
            wait([fetching])  # its files are not removed under it
            reader.close()
            shutil.rmtree(staging, ignore_errors=True)
            room.close()

        try:
            status, transfer = _restore(
                ctx, sandbox_id, head.result(), timeline, image=image, source=snapshot_id, fetched=fetched,
                keep_busy=lazily and not held, identity=identity,
            )  # fmt: skip
        except BaseException:
            release()
            raise
        if transfer is None:
            release()
            return status
        if held:
            # It may be held for hours: the store's lock goes, and so does the staged layer (in
            # the sandbox now), which would hold the node's disk or memory all that time.
            reader.unlock()
            (staging / ckpt.LAYER).unlink(missing_ok=True)
        layout = ctx.sandboxes.layout(sandbox_id)
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
        ctx = self.ctx
        try:
            try:
                error = transfer.wait()
            finally:
                release()
            if transfer.abandoned:
                log.info("node %s stopped the held memory of sandbox %s, which is gone", ctx.name, sandbox_id)
            elif error:
                log.error("node %s removes sandbox %s: %s", ctx.name, sandbox_id, error)
                if isinstance(transfer.failure, SnapshotCorrupt):
                    with self._lock:
                        self._eager_next.add(snapshot_id)
                with suppress(NotFound):
                    remove_now(ctx, ctx.sandboxes.record(sandbox_id), layout)
            else:
                try:
                    record = ctx.sandboxes.record(sandbox_id)
                    resident = timeline.record(Phase.RESIDENT, timeline.started)
                    record.timings_ms = {**record.timings_ms, Phase.RESIDENT.key: resident}
                    record.save(layout.record)
                except NotFound:
                    pass
        finally:
            layout.arriving.unlink(missing_ok=True)
            with self._lock:
                arriving = self._arriving.pop(sandbox_id, None)
            if not transfer.hold_asked:
                ctx.sandboxes.done(sandbox_id)  # it was kept busy until now
            if arriving is not None:
                arriving[0].set()

    def settle(self, sandbox_id: str, timeout_s: float = SETTLE_S) -> None:
        """Before an operation that reads all of a sandbox's memory (a checkpoint): if it is
        held, let the rest arrive and wait for it. A sandbox whose memory is arriving unheld is
        busy, and the operation is refused as before."""
        arriving = self._held(sandbox_id)
        if arriving is None:
            return
        arrived, transfer = arriving
        transfer.release()
        if not arrived.wait(timeout_s):
            raise Busy(
                f"sandbox {sandbox_id!r} on node {self.ctx.name} still lacks memory "
                f"{timeout_s:.0f} s after its hold was released"
            )

    def forget(self, sandbox_id: str) -> None:
        """After a sandbox is removed: stop its held transfer, which would wait for faults
        for good (CRIU's daemon hears nothing of its processes' exit while held)."""
        arriving = self._held(sandbox_id)
        if arriving is not None:
            arriving[1].abandon()
            arriving[0].wait(CLOSE_REMOVE_S)

    def _held(self, sandbox_id: str) -> tuple[threading.Event, lazy.Transfer] | None:
        """The sandbox's arrival, if its transfer was started held and is not over."""
        with self._lock:
            arriving = self._arriving.get(sandbox_id)
        return arriving if arriving is not None and arriving[1].hold_asked else None

    def close(self, timeout_s: float) -> None:
        """Release every held transfer, wait up to `timeout_s` for memory still arriving, then
        remove each sandbox that still lacks some. Its pages would read as zeros without this
        agent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            arriving = dict(self._arriving)
        for _, transfer in arriving.values():
            transfer.release()
        for arrived, _ in arriving.values():
            arrived.wait(max(0.0, deadline - time.monotonic()))
        late = {sandbox_id: pair for sandbox_id, pair in arriving.items() if not pair[0].is_set()}
        for sandbox_id, (_, transfer) in late.items():
            # Stopping its transfer fails the memory's wait, which removes the sandbox: nothing
            # of the restore outlives the agent.
            log.warning("node %s removes sandbox %s: its memory is still arriving", self.ctx.name, sandbox_id)
            _stop_arriving(self.ctx, sandbox_id, transfer)
        deadline = time.monotonic() + CLOSE_REMOVE_S
        for sandbox_id, (arrived, _) in late.items():
            if not arrived.wait(max(0.0, deadline - time.monotonic())):
                with suppress(NotFound):
                    sandboxes = self.ctx.sandboxes
                    remove_now(self.ctx, sandboxes.record(sandbox_id), sandboxes.layout(sandbox_id))
        self.userfaultfd.release()


def _restore(
    ctx: NodeContext,
    sandbox_id: str,
    head: ckpt.CheckpointImage,
    timeline: Timeline,
    *,
    image: str,
    source: str,
    fetched: Fetched,
    keep_busy: bool = False,
    identity: Identity = KEEP,
) -> tuple[SandboxStatus, lazy.Transfer | None]:
    """Restore the sandbox whose checkpoint `head` describes, as `identity` (validated) says.
    Its network and writable layer's disk are made first; then `fetched()` gives the checkpoint
    whole (once its files are here, in a directory this restore may change) and, for a lazy
    restore, the transfer of its memory."""
    local = _restore_image(ctx, head, image, timeline)
    if head.backend != ctx.backend.name:
        raise FailedPrecondition(
            f"checkpoint {source} was taken by the {head.backend} backend; "
            f"node {ctx.name} runs {ctx.backend.name}"
        )
    checkpoints = ctx.backend.checkpoints
    files = fork_files(identity.fork) if identity.fork is not None else ()
    if files and not checkpoints.places_files:
        raise FailedPrecondition(f"node {ctx.name}'s {ctx.backend.name} backend restores no fork child")
    spec = identity.spec(head.spec)
    record = SandboxRecord(
        id=sandbox_id,
        node=ctx.name,
        backend=ctx.backend.name,
        spec=spec,
        image_digest=local.digest,
        created_at=time.time(),
        restored_from=source,
    )
    with ctx.sandboxes.new(
        sandbox_id,
        record,
        keep_busy=keep_busy,
        alongside=lambda layout: checkpoints.prepare_restore(record, layout),
    ) as layout:
        checkpoint, transfer = fetched()
        if transfer is not None:
            layout.arriving.touch()
        if spec.hostname != head.spec.hostname:
            # Named in its images, the UTS namespace restores with the child's name: its
            # processes never see the parent's.
            try:
                criu_images.rename_host(checkpoint.criu_dir, spec.hostname)
            except ValueError as exc:
                if transfer is not None:
                    transfer.abort()
                raise CheckpointCorrupt(f"checkpoint {source}: {exc}") from None
        with timeline.phase(Phase.RESTORE):
            pid = checkpoints.restore(record, layout, local, checkpoint, transfer, files)
        try:
            record.timings_ms = timeline.timings_ms()
            # What the restored process writes from its first instant on belongs to this
            # run. (Checkpoints older than `log_bytes` are measured now, a little late.)
            record.log_start = (
                checkpoint.sizes.log_bytes or logs.read(ctx.backend.upper_dir(record, layout), 0, None)[1]
            )
            record.save(layout.record)
        except BaseException:
            if transfer is not None:
                _stop_arriving(ctx, sandbox_id, transfer)
            raise
    # Running as of the restore's return; asking the runtime again would only cost time.
    status = SandboxStatus(record=record, state=SandboxState.RUNNING, pid=pid, busy=keep_busy)
    return status, transfer


def _restore_image(
    ctx: NodeContext, checkpoint: ckpt.CheckpointImage, image: str, timeline: Timeline
) -> Image:
    ref = image or checkpoint.spec.image
    if ctx.images.has(checkpoint.image_digest) and not image:
        return ctx.images.resolve(checkpoint.image_digest)
    try:
        local = resolve_image(ctx, ref, timeline)
    except NotFound:
        if ctx.images.has(checkpoint.image_digest):
            return ctx.images.resolve(checkpoint.image_digest)
        raise
    if local.digest != checkpoint.image_digest:
        raise ImageMismatch(checkpoint.image_digest, local.digest, ref)
    return local


def _foreign_user_namespace(ctx: NodeContext, checkpoint: ckpt.CheckpointImage) -> str:
    """Why CRIU would not restore these tasks as a sandbox's, unprivileged on this node (the
    images, which the node that took them wrote, decide the user namespace); "" if it would."""
    if not ctx.userns_base:
        return ""
    problem = criu_images.user_namespace_problem(checkpoint.directory / ckpt.CRIU_DIR, ctx.userns_base)
    return f"its images would not restore as a sandbox's: {problem}" if problem else ""


def _stop_arriving(ctx: NodeContext, sandbox_id: str, transfer: lazy.Transfer) -> None:
    """Kill a running sandbox whose memory is still arriving, then stop its transfer (CRIU's
    daemon and the page server): killed first, it never runs on a page it lacks."""
    stop_quietly(ctx, sandbox_id)
    transfer.abort()
