"""Verify: grade an exited sandbox by running a command in a fresh sandbox that sees its final tree."""

from __future__ import annotations

import signal as signals
import time
from contextlib import ExitStack
from dataclasses import dataclass

from sandbox_agent.errors import FailedPrecondition, InvalidSpec
from sandbox_agent.host import overlay
from sandbox_agent.node import logs
from sandbox_agent.node.context import NodeContext
from sandbox_agent.node.create import create
from sandbox_agent.spec import SandboxSpec, SandboxState

MAX_VERIFIER_S = 30 * 86400
"""The longest a verifier may be given: an infinite one would hold the sandbox and a worker forever."""


@dataclass(frozen=True)
class VerifierResult:
    exit_code: int | None
    timed_out: bool
    log: bytes
    """Tail of the verifier's stdout and stderr."""
    duration_ms: float


def run_verifier(
    ctx: NodeContext,
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
    record = ctx.sandboxes.record(sandbox_id)
    if not ctx.backend.runs_verifiers:
        raise FailedPrecondition(f"node {ctx.name} runs {ctx.backend.name}; verifiers need the runc backend")
    if not 0 < timeout_s <= MAX_VERIFIER_S:  # NaN fails too
        raise InvalidSpec("timeout_s", f"{timeout_s} must be > 0 and <= {MAX_VERIFIER_S}")
    verifier_id = f"{sandbox_id}-verify"
    with ctx.sandboxes.exclusive(sandbox_id):
        layout = ctx.sandboxes.layout(sandbox_id)
        state, _ = ctx.backend.status(record, layout)
        if state != SandboxState.EXITED:
            raise FailedPrecondition(
                f"sandbox {sandbox_id!r} is {state}; a verifier runs after the harness exits"
            )
        # The graded layer must not be an upper dir of a live mount while it is a lower one.
        ctx.backend.destroy(record, layout)
        graded = ctx.backend.mount_graded(layout, ctx.images.resolve(record.image_digest), ctx.userns_base)
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
            vrecord = create(ctx, verifier_id, spec, files, graded=graded)
            vlayout = ctx.sandboxes.layout(verifier_id)
            cleanup.callback(ctx.sandboxes.teardown, vrecord, vlayout)
            status = ctx.sandboxes.status(vrecord)
            while status.state != SandboxState.EXITED and time.monotonic() - started < timeout_s:
                time.sleep(0.1)
                status = ctx.sandboxes.status(vrecord)
            timed_out = status.state != SandboxState.EXITED
            if timed_out:
                ctx.backend.kill(vrecord, vlayout, signals.SIGKILL)
                status = ctx.sandboxes.status(vrecord)
            return VerifierResult(
                exit_code=status.exit_code,
                timed_out=timed_out,
                log=logs.read(ctx.backend.upper_dir(vrecord, vlayout), 65536, None)[0],
                duration_ms=round((time.monotonic() - started) * 1000, 1),
            )
