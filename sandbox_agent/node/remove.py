"""Kill and remove: signal a sandbox's processes, or remove everything of it on the node."""

from __future__ import annotations

import signal as signals

from sandbox_agent.errors import InvalidSpec, NotFound
from sandbox_agent.node.context import NodeContext
from sandbox_agent.runtime.backend import SandboxLayout
from sandbox_agent.spec import SandboxRecord, SandboxStatus


def kill(ctx: NodeContext, sandbox_id: str, signal: int) -> SandboxStatus:
    if signal not in signals.valid_signals() or signal == 0:
        raise InvalidSpec("signal", f"{signal} is not a signal number")
    record = ctx.sandboxes.record(sandbox_id)
    with ctx.sandboxes.exclusive(sandbox_id):
        ctx.backend.kill(record, ctx.sandboxes.layout(sandbox_id), signal)
    return ctx.sandboxes.status(record)


def delete(ctx: NodeContext, sandbox_id: str) -> None:
    record = ctx.sandboxes.record(sandbox_id)
    with ctx.sandboxes.exclusive(sandbox_id):
        remove_now(ctx, record, ctx.sandboxes.layout(sandbox_id))


def remove_now(ctx: NodeContext, record: SandboxRecord, layout: SandboxLayout) -> None:
    """Kill a sandbox's processes and remove everything of it on the node. `delete` calls it
    in the sandbox's turn; a sandbox that lacks memory it cannot get is removed so whatever
    it is busy with, and the control plane, finding it gone, restores it again."""
    ctx.backend.kill(record, layout, signals.SIGKILL)
    ctx.sandboxes.teardown(record, layout)


def stop_quietly(ctx: NodeContext, sandbox_id: str) -> None:
    """Kill a sandbox's processes at once, whatever it is busy with (a lazy restore's fault)."""
    try:
        record = ctx.sandboxes.record(sandbox_id)
    except NotFound:
        return
    ctx.backend.kill(record, ctx.sandboxes.layout(sandbox_id), signals.SIGKILL)
