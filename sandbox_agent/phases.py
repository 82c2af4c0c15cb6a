"""Checkpoint and restore phases, timed through one mechanism, with optional hooks around each.

Every phase is a `Phase`; its duration is recorded as `<phase>_ms`, the key the checkpoint's
metadata, the snapshot manifest and the RPC result all use. Hooks are typed, optional callbacks
in the manner of CRIU's action scripts: `before` runs as a phase starts (raising aborts the
operation, which then fails as any failed step does: the sandbox keeps running), `after` gets the
phase's duration. Operators use them for logging and metrics; tests use them to inject faults.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)


class Phase(enum.StrEnum):
    # checkpoint
    FREEZE = "freeze"
    """Freezing the sandbox's cgroup."""
    DUMP = "dump"
    """CRIU writing the process images."""
    LAYER = "layer"
    """Archiving the writable overlay layer."""
    PUT = "put"
    """Writing the checkpoint into the snapshot store (chunk, compress, upload, commit)."""
    FROZEN = "frozen"
    """Not a step but a span: how long the harness was stalled, from freeze to thaw or kill."""
    NODE_FREE = "node_free"
    """A span: from the freeze until a stopping sandbox's processes are gone and its memory free."""
    DURABLE = "durable"
    """A span: from the freeze until the snapshot is committed to the store."""
    # create and restore
    PULL = "pull"
    """Fetching and unpacking an image the node did not have."""
    # restore
    FETCH = "fetch"
    """Fetching the snapshot from the store, every chunk verified."""
    VERIFY = "verify"
    """Checking the checkpoint directory's files against their recorded hashes."""
    RESTORE = "restore"
    """Rebuilding the writable layer and CRIU restoring the processes (the network and the
    layer's disk are made while the snapshot is fetched)."""
    RESIDENT = "resident"
    """A span: from the restore's start until a lazily restored sandbox has all its memory."""
    # both
    TOTAL = "total"

    @property
    def key(self) -> str:
        return f"{self.value}_ms"


@dataclass(frozen=True)
class PhaseHooks:
    before: Callable[[Phase, str], None] | None = None
    """Called with the phase and the sandbox id as the phase starts."""
    after: Callable[[Phase, str, float], None] | None = None
    """Called with the phase, the sandbox id and its duration in ms once it has ended."""


class Timeline:
    """The timed phases of one checkpoint or restore of one sandbox."""

    def __init__(self, sandbox_id: str, hooks: PhaseHooks | None = None) -> None:
        self.sandbox_id = sandbox_id
        self.hooks = hooks or PhaseHooks()
        self._ms: dict[str, float] = {}
        self.started = time.monotonic()

    @contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        if self.hooks.before is not None:
            self.hooks.before(phase, self.sandbox_id)
        started = time.monotonic()
        yield
        self.record(phase, started)

    def record(self, phase: Phase, started: float, ended: float | None = None) -> float:
        """Record a phase or span that began at `started` (time.monotonic) and ends now or at `ended`."""
        return self.measured(phase, ((time.monotonic() if ended is None else ended) - started) * 1000)

    def measured(self, phase: Phase, ms: float) -> float:
        """Record a phase or span that lasted `ms`, as measured here or elsewhere (CRIU's own clock)."""
        ms = round(ms, 1)
        self._ms[phase.key] = ms
        if self.hooks.after is not None:
            self.hooks.after(phase, self.sandbox_id, ms)
        return ms

    def add(self, timings_ms: dict[str, float]) -> None:
        """Fold in timings measured elsewhere (the snapshot store's own phases)."""
        self._ms.update(timings_ms)

    def timings_ms(self) -> dict[str, float]:
        """Every phase so far, plus the total since the timeline began."""
        return {**self._ms, Phase.TOTAL.key: round((time.monotonic() - self.started) * 1000, 1)}
