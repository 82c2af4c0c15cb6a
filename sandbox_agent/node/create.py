"""Create: validate a spec, lay it over its image, build the sandbox and start it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from sandbox_agent.errors import NotFound
from sandbox_agent.images import oci
from sandbox_agent.images.cache import Image
from sandbox_agent.node.context import NodeContext
from sandbox_agent.phases import Phase, Timeline
from sandbox_agent.runtime import launch
from sandbox_agent.spec import SandboxRecord, SandboxSpec, validate_files


def create(
    ctx: NodeContext,
    sandbox_id: str,
    spec: SandboxSpec,
    files: dict[str, bytes],
    graded: Path | None = None,
) -> SandboxRecord:
    """Validate, build and start a fresh sandbox; nothing of it remains if any step fails."""
    spec = spec.validated()
    files = validate_files(files)
    timeline = Timeline(sandbox_id, ctx.hooks)
    image = resolve_image(ctx, spec.image, timeline)
    spec = replace(launch.effective(spec, image), userns_base=ctx.userns_base).validated()
    record = SandboxRecord(
        id=sandbox_id,
        node=ctx.name,
        backend=ctx.backend.name,
        spec=spec,
        image_digest=image.digest,
        created_at=time.time(),
        timings_ms=timeline.timings_ms(),
    )
    with ctx.sandboxes.new(sandbox_id, record) as layout:
        ctx.backend.create(record, layout, image, files, graded)
        ctx.backend.start(record, layout)
    return record


def resolve_image(ctx: NodeContext, ref: str, timeline: Timeline) -> Image:
    """The cached image, or one pulled now if the reference names a source this node can
    reach (the pull is timed as its own phase)."""
    try:
        return ctx.images.resolve(ref)
    except NotFound:
        if not oci.is_pullable(ref):
            raise
    with timeline.phase(Phase.PULL):
        return ctx.images.pull(ref, ctx.registry)
