"""Faults a test injects through a node's seams, around the real thing: its snapshot store (a
slow or failing store, as the page server and the fetch meet it) and its runtime (a restore
that fails at a chosen step). Everything else is real: runc, CRIU and the store beneath."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_agent.criu import lazy
from sandbox_agent.runtime.backend import Backend, Checkpoints
from snapshots import SnapshotStore, StoreUnavailable


@dataclass
class StoreFaults:
    """How the store's files answer, switched by the test as it goes."""

    url: str
    page_delay_s: float = 0.0
    """Every page the page server reads arrives this late: a slow store."""
    pages_before_failure: int | None = None
    """The page server's reads fail (StoreUnavailable) after this many."""
    fetch_fails: bool = False
    """The fetch of the snapshot's files fails at its first read."""
    pages_read: int = 0

    def store(self, real: SnapshotStore) -> FaultyStore:
        return FaultyStore(real, self)

    def unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(self.url, None, "the store went away (injected)")


class FaultyStore:
    """The node's real snapshot store, its readers' files answering as `faults` says."""

    def __init__(self, real: SnapshotStore, faults: StoreFaults) -> None:
        self._real, self._faults = real, faults

    def reader(self, snapshot_id: str, digest: str | None = None) -> _Reader:
        return _Reader(self._real.reader(snapshot_id, digest), self._faults)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Reader:
    def __init__(self, real: Any, faults: StoreFaults) -> None:
        self._real, self._faults = real, faults

    def open(self, path: str) -> _File:
        return _File(self._real.open(path), self._faults)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _File:
    def __init__(self, real: Any, faults: StoreFaults) -> None:
        self._real, self._faults = real, faults

    def read(self, offset: int, length: int) -> bytes:
        if self._faults.fetch_fails and threading.current_thread().name.startswith("fetch-"):
            raise self._faults.unavailable()
        data: bytes = self._real.read(offset, length)
        return data

    def read_views(self, offset: int, length: int) -> list[memoryview]:
        faults = self._faults
        if threading.current_thread().name == "lazy-pages":  # the page server, not the eager pages
            faults.pages_read += 1
            if faults.pages_before_failure is not None and faults.pages_read > faults.pages_before_failure:
                raise faults.unavailable()
            time.sleep(faults.page_delay_s)
        views: list[memoryview] = self._real.read_views(offset, length)
        return views

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@dataclass
class RestoreFaults:
    """Where the runtime's next restore fails, if anywhere: "layer disk" (while the snapshot's
    files are fetched) or "after daemon" (once CRIU's lazy-pages daemon has started)."""

    step: str = ""

    def runtime(self, real: Backend) -> FaultyRuntime:
        return FaultyRuntime(real, self)


class FaultyRuntime:
    """The node's real runtime, its restores failing where `faults` says."""

    def __init__(self, real: Backend, faults: RestoreFaults) -> None:
        self._real = real
        self.checkpoints = _FaultyCheckpoints(real.checkpoints, faults)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _FaultyCheckpoints:
    def __init__(self, real: Checkpoints, faults: RestoreFaults) -> None:
        self._real, self._faults = real, faults

    def prepare_restore(self, *args: Any) -> None:
        if self._faults.step == "layer disk":
            raise OSError("no room for the layer's disk (injected)")
        self._real.prepare_restore(*args)

    def restore(
        self, record: Any, layout: Any, image: Any, checkpoint: Any, transfer: Any = None, files: Any = ()
    ) -> int:
        if self._faults.step == "after daemon" and transfer is not None:
            transfer = _FailsOnceStarted(transfer)
        return self._real.restore(record, layout, image, checkpoint, transfer, files)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _FailsOnceStarted:
    """A transfer that fails as soon as CRIU's lazy-pages daemon has started, where the restore
    goes on to unpack the sandbox's layer."""

    def __init__(self, real: lazy.Transfer) -> None:
        self._real = real

    def start(self, criu: lazy.DaemonStarter, images: Path, work: Path) -> None:
        self._real.start(criu, images, work)
        raise OSError("the layer cannot be unpacked (injected)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)
