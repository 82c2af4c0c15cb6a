"""Start-up: the base image in the cache, and what a crashed agent left half done finished or undone."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.errors import NotFound
from sandbox_agent.host import network
from sandbox_agent.node.checkpoint import revive
from sandbox_agent.node.context import NodeContext
from sandbox_agent.node.remove import remove_now
from sandbox_agent.node.sandboxes import partial
from sandbox_agent.spec import SandboxState

log = logging.getLogger(__name__)


def import_base_image(ctx: NodeContext) -> None:
    tar = ctx.settings.base_image_tar
    if tar is None:
        return
    with ctx.images.importing():
        try:
            ctx.images.resolve("base")
        except NotFound:
            if tar.is_file():
                image = ctx.images.import_tarball(tar, name="base")
                log.info("node %s imported base image %s", ctx.name, image.digest)


def recover(ctx: NodeContext) -> None:
    """After a crash: drop half-made sandboxes and containers that have no record, and finish
    or undo what an operation left half done."""
    known, unrecorded = ctx.sandboxes.recover()
    leftovers = ctx.backend.remove_leftovers(known)
    for leftover in leftovers:
        log.warning("node %s removed container %s that had no record", ctx.name, leftover)
    if ctx.backend.wants_netns:
        # Its tasks are gone; its netns, veth and route would keep its address taken.
        for sandbox_id in sorted({*leftovers, *unrecorded}):
            network.reclaim(ctx.settings.host_key, sandbox_id)
    for sandbox_id in known:
        _recover_sandbox(ctx, sandbox_id)
    # Whatever a crash left half-written here is garbage now (recovery took what it needed);
    # committed checkpoints live elsewhere.
    for staging in (ctx.staging, ctx.memory_staging):
        for half_written in staging.iterdir() if staging is not None else ():
            shutil.rmtree(half_written, ignore_errors=True)


def _recover_sandbox(ctx: NodeContext, sandbox_id: str) -> None:
    record, layout = ctx.sandboxes.record(sandbox_id), ctx.sandboxes.layout(sandbox_id)
    if layout.arriving.exists():
        # Its agent died while the sandbox's memory was still arriving: pages it never
        # got would read as zeros. Its snapshot is intact; the control plane restores
        # it again once it finds it gone.
        log.warning(
            "node %s removes sandbox %s: its lazy restore ended with this agent", ctx.name, sandbox_id
        )
        remove_now(ctx, record, layout)
        return
    state = ctx.backend.status(record, layout)[0]
    if layout.stopped.exists() and state == SandboxState.EXITED:
        # Its agent died between the kill and the commit: the snapshot never landed.
        images = Path(layout.stopped.read_text())
        revive(ctx, record, layout, images)
        if images.name == ckpt.CRIU_DIR and images.parent.name.startswith(partial(sandbox_id)):
            shutil.rmtree(images.parent, ignore_errors=True)
        return
    # A stopping dump that never finished: the sandbox runs on, and its mark goes.
    layout.stopped.unlink(missing_ok=True)
    if state == SandboxState.PAUSED:
        # Only a checkpoint freezes a sandbox; this one's agent died before it thawed.
        ctx.backend.thaw(record, layout)
        log.warning(
            "node %s thawed sandbox %s left frozen by an interrupted checkpoint", ctx.name, sandbox_id
        )
