"""Spare writable-layer filesystems, made ahead so that a new or restored sandbox's disk is a
rename and a loop mount instead of a mkfs (12-14 ms) on the restore's critical path."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from sandbox_agent.host import overlay

log = logging.getLogger(__name__)

Size = tuple[int, int]
"""A layer filesystem's size in MiB and its number of inodes."""


class LayerDisks:
    """Empty layer filesystems (`overlay.make_layer_fs`) kept in `directory`, `per_size` of each of
    the `sizes` last asked for. A spare is taken by renaming it, so `directory` must be on the
    filesystem of the sandboxes' dirs. One worker thread makes them again in the background,
    `quiet_s` after the last one was taken and at the lowest CPU priority, so as not to slow the
    restore that took it."""

    def __init__(self, directory: Path, *, per_size: int = 2, sizes: int = 2, quiet_s: float = 0.25) -> None:
        self._dir = directory
        self._per_size = per_size
        self._sizes = sizes
        self._quiet_s = quiet_s
        self._taken_at = 0.0
        self._spares: OrderedDict[Size, list[Path]] = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False
        self._worker: threading.Thread | None = None
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.iterdir():  # a spare made by an earlier agent is not trusted
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink()

    def warm(self, size: Size) -> None:
        """Make spares of `size` in the background, before any sandbox asks for one."""
        with self._cond:
            self._spares.setdefault(size, [])
            self._start_worker()
            self._cond.notify()

    def place(self, image: Path, size: Size) -> None:
        """Put an empty layer filesystem of `size` at `image`: a spare if there is one."""
        with self._cond:
            spares = self._spares.setdefault(size, [])
            self._spares.move_to_end(size)
            spare = spares.pop() if spares else None
            self._taken_at = time.monotonic()
            for evicted in list(self._spares)[: -self._sizes]:
                for path in self._spares.pop(evicted):
                    path.unlink(missing_ok=True)
            self._start_worker()
            self._cond.notify()
        if spare is not None:
            try:
                os.rename(spare, image)
                return
            except OSError as exc:  # removed under us: make one here
                log.warning("spare layer disk %s is gone (%s); making one", spare, exc)
        overlay.make_layer_fs(image, *size)

    def close(self) -> None:
        """Stop making spares and remove those made."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            worker = self._worker
        if worker is not None:
            worker.join(timeout=30)
        with self._cond:
            for spares in self._spares.values():
                for path in spares:
                    path.unlink(missing_ok=True)
            self._spares.clear()

    def _start_worker(self) -> None:
        if self._worker is None and not self._closed:
            self._worker = threading.Thread(target=self._refill, name="layer-disks", daemon=True)
            self._worker.start()

    def _wanted(self) -> Size | None:
        for size, spares in reversed(self._spares.items()):
            if len(spares) < self._per_size:
                return size
        return None

    def _next(self) -> Size | None:
        """The size to make a spare of, once none has been taken for `quiet_s`; None once closed."""
        with self._cond:
            while not self._closed:
                quiet = self._taken_at + self._quiet_s - time.monotonic()
                if quiet > 0:
                    self._cond.wait(quiet)
                elif (size := self._wanted()) is not None:
                    return size
                else:
                    self._cond.wait()
            return None

    def _refill(self) -> None:
        while (size := self._next()) is not None:
            path = self._dir / f"{size[0]}-{size[1]}-{uuid.uuid4().hex}.img"
            partial = path.with_suffix(".partial")
            try:
                overlay.make_layer_fs(partial, *size, nice=True)
                os.rename(partial, path)
            except Exception as exc:  # the node's root went away, or the disk is full: stop
                partial.unlink(missing_ok=True)
                log.warning("cannot make a spare layer disk in %s: %s", self._dir, exc)
                with self._cond:
                    self._worker = None
                return
            with self._cond:
                if self._closed or size not in self._spares:
                    path.unlink(missing_ok=True)
                else:
                    self._spares[size].append(path)
