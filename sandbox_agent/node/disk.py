"""The node's disk as sandboxes may use it: admitted against what it holds, never overcommitted.

A sandbox's writable layer is an ext4 filesystem in a sparse file (`host/overlay.py`): it takes
no room until the harness writes, and then up to `resources.disk_mb`. A checkpoint stages the
layer again as a tar, with the memory images beside it, and a restore stages what it fetches.
Sparse files alone would let a few harnesses that fill their quota fill the node, and then
neighbours get EIO and checkpoints fail for want of room for their tar.

So each sandbox holds its layer's full size from the moment it is made until it is removed, and
a checkpoint or restore holds its staging (the layer's size again, and its memory) while it
runs. A sandbox is admitted only if, beside every layer held, the largest staging of any of them
would still fit: some staging can always go on, and one that does not fit now waits for another
to end instead of filling the disk.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sandbox_agent.errors import NoRoom
from sandbox_agent.spec import Resources

FREE_SHARE = 0.9
"""Of the free space at start, what a node offers when not told (`AgentSettings.disk_mb`): the
rest is for the image cache, logs and the filesystem's own slack."""

STAGING_WAIT_S = 300.0
"""How long a checkpoint or restore waits for others' staging to leave it room: about the time
a few checkpoints of 10 GiB layers take to upload; past it the operation is refused and the
control plane tries again, or elsewhere."""


def offered_mb(root: Path, share: float = FREE_SHARE) -> int:
    """What the filesystem holding `root` has free now, in MiB, times `share`."""
    st = os.statvfs(root)
    return int(st.f_bavail * st.f_frsize * share) >> 20


@dataclass(frozen=True)
class Footprint:
    """What one sandbox may take of the node's disk, in MiB."""

    layer_mb: int
    """Its writable layer when full."""
    staging_mb: int
    """A checkpoint of it, staged before upload: the layer's tar and its memory images."""

    @classmethod
    def of(cls, r: Resources) -> Footprint:
        return cls(layer_mb=r.disk_mb, staging_mb=r.disk_mb + r.memory_mb)


class DiskBudget:
    """Layers held and stagings under way, against `capacity_mb`; safe from many threads."""

    def __init__(self, node: str, capacity_mb: int) -> None:
        self.node = node
        self.capacity_mb = capacity_mb
        self._held: dict[str, Footprint] = {}
        self._staging: dict[str, int] = {}
        self._cond = threading.Condition()

    @property
    def held_mb(self) -> int:
        """Layers held and stagings under way."""
        with self._cond:
            return self._used()

    def hold(self, sandbox_id: str, r: Resources, *, admit: bool = True) -> None:
        """Hold room for a new sandbox's layer, or raise `NoRoom` naming what is short. Without
        `admit` (a sandbox found at start) it is counted whatever is left."""
        need = Footprint.of(r)
        with self._cond:
            if admit:
                layers = sum(f.layer_mb for f in self._held.values())
                kept = max([0, sum(self._staging.values()), *(f.staging_mb for f in self._held.values())])
                if layers + need.layer_mb + max(kept, need.staging_mb) > self.capacity_mb:
                    raise NoRoom(
                        f"node {self.node} cannot hold sandbox {sandbox_id!r}: it asks for "
                        f"{need.layer_mb} MiB of disk (resources.disk_mb) and {need.staging_mb} MiB "
                        f"to stage a checkpoint of it, while the node's {self.capacity_mb} MiB for "
                        f"sandboxes already holds {layers} MiB of layers and keeps {kept} MiB "
                        "for staging"
                    )
            self._held[sandbox_id] = need

    def release(self, sandbox_id: str) -> None:
        with self._cond:
            self._held.pop(sandbox_id, None)
            self._cond.notify_all()

    @contextmanager
    def staging(self, sandbox_id: str, need_mb: int, what: str, timeout_s: float) -> Iterator[None]:
        """Hold `need_mb` to stage a checkpoint or restore of a sandbox while the body runs;
        wait up to `timeout_s` for others' stagings to end, then raise `NoRoom`."""
        deadline = time.monotonic() + timeout_s
        need = max(0, need_mb)
        with self._cond:
            while self._used() + need > self.capacity_mb:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoRoom(
                        f"node {self.node} has no room to stage the {what} of sandbox {sandbox_id!r}: "
                        f"it needs {need} MiB, and after {timeout_s:g} s of waiting "
                        f"{self.capacity_mb - self._used()} MiB of the node's {self.capacity_mb} "
                        "MiB for sandboxes is free"
                    )
                self._cond.wait(left)
            self._staging[sandbox_id] = self._staging.get(sandbox_id, 0) + need
        try:
            yield
        finally:
            with self._cond:
                self._staging[sandbox_id] -= need
                if not self._staging[sandbox_id]:
                    del self._staging[sandbox_id]
                self._cond.notify_all()

    def _used(self) -> int:
        return sum(f.layer_mb for f in self._held.values()) + sum(self._staging.values())
