"""Checkpoint: freeze a sandbox, dump its memory and archive its writable layer in one freeze,
then commit them to a directory or to the snapshot store.

A failed checkpoint leaves the sandbox running: thawed, or revived from its images.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.criu import pagemap
from sandbox_agent.errors import AlreadyExists, FailedPrecondition
from sandbox_agent.host import overlay
from sandbox_agent.node import disk, logs
from sandbox_agent.node.context import NodeContext
from sandbox_agent.node.disk import Footprint
from sandbox_agent.node.sandboxes import partial
from sandbox_agent.phases import Phase, Timeline
from sandbox_agent.runtime.backend import STATE_DIR, SandboxLayout
from sandbox_agent.spec import SandboxRecord, SandboxState
from snapshots import Manifest, SnapshotMeta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotTarget:
    """Identity the orchestrator gives a snapshot before it exists."""

    snapshot_id: str
    episode_id: str
    sequence: int
    reason: str
    parent_id: str = ""
    trajectory_cursor: object = None


def checkpoint_to_store(
    ctx: NodeContext, sandbox_id: str, target: SnapshotTarget, *, leave_running: bool
) -> tuple[ckpt.CheckpointImage, Manifest]:
    """Checkpoint into the snapshot store. When stopping, the sandbox is killed once dumped and
    the upload follows; a failed upload revives it from the local images rather than lose it."""
    store = ctx.require_store()
    timeline = Timeline(sandbox_id, ctx.hooks)
    # The store hashes every chunk, so the checkpoint's own file hashes would be redundant work.
    with (
        _captured(
            ctx, sandbox_id, ctx.staging, timeline, leave_running=leave_running, hash_files=False
        ) as image,
        timeline.phase(Phase.PUT),
    ):
        meta = SnapshotMeta(
            snapshot_id=target.snapshot_id,
            episode_id=target.episode_id,
            seq=target.sequence,
            parent_id=target.parent_id or None,
            node=ctx.name,
            reason=target.reason,
            created_at=datetime.fromtimestamp(image.created_at, UTC),
            image_digest=image.image_digest,
            runtime_backend=image.backend,
            criu_version=image.criu_version,
            trajectory_cursor=target.trajectory_cursor,
            timings_ms=image.timings_ms,
        )
        manifest = store.put(image.directory, meta, aligner=pagemap.align_memory)
    # The manifest keeps what was known at commit; the reply adds the put itself.
    timeline.add(dict(manifest.timings_ms))
    return replace(image, timings_ms=timeline.timings_ms()), manifest


def checkpoint_to_dir(
    ctx: NodeContext, sandbox_id: str, dest: Path, *, leave_running: bool
) -> ckpt.CheckpointImage:
    """Checkpoint into `dest`, a directory this node makes, every file hashed."""
    if dest.exists():
        raise AlreadyExists(f"checkpoint destination {dest} already exists")
    timeline = Timeline(sandbox_id, ctx.hooks)
    with _captured(
        ctx, sandbox_id, dest.parent, timeline, leave_running=leave_running, hash_files=True
    ) as image:
        os.rename(image.directory, dest)
    return replace(image, directory=dest, timings_ms=timeline.timings_ms())


@contextmanager
def _captured(
    ctx: NodeContext,
    sandbox_id: str,
    parent: Path,
    timeline: Timeline,
    *,
    leave_running: bool,
    hash_files: bool,
) -> Iterator[ckpt.CheckpointImage]:
    """Capture memory and layer in one freeze and yield the sealed checkpoint in a staging dir.

    The body commits it somewhere. With leave_running the sandbox is thawed once its layer is
    archived. Without, it is killed as soon as its memory is dumped, which frees the node
    before the slow part (layer, hashing, upload); it is removed once the body has committed.
    If anything fails, the sandbox keeps running: thawed, or revived from the images.
    """
    record = ctx.sandboxes.record(sandbox_id)
    with ctx.sandboxes.exclusive(sandbox_id):
        layout = ctx.sandboxes.layout(sandbox_id)
        state, _ = ctx.backend.status(record, layout)
        if state != SandboxState.RUNNING:
            raise FailedPrecondition(f"sandbox {sandbox_id!r} on node {ctx.name} is {state}, not running")
        parent.mkdir(parents=True, exist_ok=True)
        staging = parent / f"{partial(sandbox_id)}{uuid.uuid4().hex[:8]}"
        need = Footprint.of(record.spec.resources).staging_mb
        with ctx.disk.staging(sandbox_id, need, "checkpoint", disk.STAGING_WAIT_S):
            staging.mkdir()
            images = staging / ckpt.CRIU_DIR
            frozen = False
            stopped = False
            try:
                frozen_wall = time.time()
                began = time.monotonic()
                if leave_running:
                    with timeline.phase(Phase.FREEZE):
                        ctx.backend.freeze(record, layout)
                    frozen = True
                    with timeline.phase(Phase.DUMP):
                        ctx.backend.checkpoints.dump(record, layout, images)
                else:
                    _dump_and_stop(ctx, record, layout, images, timeline, began)
                    stopped = True
                with timeline.phase(Phase.LAYER):
                    upper = ctx.backend.upper_dir(record, layout)
                    layer_bytes = overlay.export_layer(upper, staging / ckpt.LAYER, first=STATE_DIR)
                    log_bytes = logs.read(upper, 0, None)[1]
                if leave_running:
                    ctx.backend.thaw(record, layout)
                    frozen = False
                    timeline.record(Phase.FROZEN, began)
                image = ckpt.CheckpointImage(
                    sandbox_id=sandbox_id,
                    node=ctx.name,
                    backend=ctx.backend.name,
                    spec=record.spec,
                    image_digest=record.image_digest,
                    criu_version=ctx.criu_version,
                    # The instant the state is of: what the harness had done when it froze.
                    created_at=frozen_wall,
                    leave_running=leave_running,
                    timings_ms=timeline.timings_ms(),
                    sizes=ckpt.Sizes(
                        criu_bytes=sum(p.stat().st_size for p in images.iterdir()),
                        layer_bytes=layer_bytes,
                        log_bytes=log_bytes,
                    ),
                    oci_spec=ctx.backend.oci_spec(record, layout),
                    directory=staging,
                )
                yield ckpt.seal(image, hash_files=hash_files)
                timeline.record(Phase.DURABLE, began)
            except BaseException:
                if frozen:
                    ctx.backend.thaw(record, layout)
                elif stopped:
                    revive(ctx, record, layout, images)
                raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if not leave_running:
            ctx.sandboxes.teardown(record, layout)


def _dump_and_stop(
    ctx: NodeContext,
    record: SandboxRecord,
    layout: SandboxLayout,
    images: Path,
    timeline: Timeline,
    began: float,
) -> None:
    """Stopping: the processes go as soon as their memory is written. The layer can wait, since
    nothing writes to it once they are gone; if anything after this fails, they are revived from
    these images. The mark goes first, so an agent that dies once they are gone still revives them."""
    layout.stopped.write_text(str(images))
    try:
        with timeline.phase(Phase.DUMP):
            frozen_ms = ctx.backend.checkpoints.dump_and_stop(record, layout, images)
    except BaseException:
        layout.stopped.unlink(missing_ok=True)  # it runs on, as it was
        raise
    free_ms = (time.monotonic() - began) * 1000
    # Frozen for part of the dump, where CRIU says how long; else for all of it.
    timeline.measured(Phase.FROZEN, free_ms if frozen_ms is None else min(frozen_ms, free_ms))
    timeline.measured(Phase.NODE_FREE, free_ms)


def revive(ctx: NodeContext, record: SandboxRecord, layout: SandboxLayout, images: Path) -> None:
    """Bring back a sandbox stopped for a checkpoint that then failed. If that fails too, the
    sandbox is removed, and the orchestrator resumes the episode from its last snapshot."""
    try:
        ctx.backend.checkpoints.revive(record, layout, images)
    except Exception:
        log.exception("node %s could not revive sandbox %s; removing it", ctx.name, record.id)
        ctx.sandboxes.teardown(record, layout)
        return
    layout.stopped.unlink(missing_ok=True)
    log.warning("node %s revived sandbox %s after its checkpoint failed", ctx.name, record.id)
