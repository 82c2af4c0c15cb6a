"""Reading a snapshot back: its tree rebuilt at a destination (`build_tree`, every chunk verified),
one of its files found (`file_entry`), and `SnapshotReader`, one snapshot opened the way a restore
reads it."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ._chunkstore import ChunkStore
from ._locks import LockKind, StoreLock
from ._manifest import Entry, EntryKind, Manifest
from ._random import StoredFile

if TYPE_CHECKING:
    from ._store import SnapshotStore


def build_tree(
    chunks: ChunkStore, manifest: Manifest, dest: str | os.PathLike[str], leave_out: Callable[[str], object]
) -> None:
    """Recreate a snapshot's tree at dest, built beside it and renamed into place, every chunk
    verified (`SnapshotStore.fetch`'s work, under the caller's lock)."""
    target = Path(dest)
    work = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex}")
    work.mkdir(mode=0o700)
    try:
        files: list[tuple[Entry, Path]] = []
        for entry in manifest.entries:
            path = work / entry.path
            if entry.kind is EntryKind.DIR:
                path.mkdir(mode=0o700)
            elif entry.kind is EntryKind.SYMLINK:
                os.symlink(entry.target or "", path)
            else:
                with open(path, "wb") as f:
                    f.truncate(entry.size)
                if not leave_out(entry.path):
                    files.append((entry, path))
        chunks.restore_files(manifest.snapshot_id, files)
        # Modes last, deepest first, so read-only files and dirs do not block their own filling.
        for entry in reversed(manifest.entries):
            if entry.kind is not EntryKind.SYMLINK:
                os.chmod(work / entry.path, entry.mode)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def file_entry(manifest: Manifest, path: str) -> Entry:
    """The regular file `path` of a snapshot; FileNotFoundError if it has none."""
    entry = next((e for e in manifest.entries if e.path == path and e.kind is EntryKind.FILE), None)
    if entry is None:
        raise FileNotFoundError(f"snapshot {manifest.snapshot_id} has no file {path}")
    return entry


class SnapshotReader:
    """One snapshot, opened for reading from any thread, as a restore reads it: one shared store
    lock (taken at the first read, held until `close`), under which the manifest is read once,
    the tree fetched (`fetch`) and files opened for reads at any offset (`open`, each once). One
    lock instead of one per file: each lock is a durable write and a listing of the store's locks."""

    def __init__(self, store: SnapshotStore, snapshot_id: str, digest: str | None = None) -> None:
        self.store = store
        self.snapshot_id = snapshot_id
        self.digest = digest
        """The manifest digest the snapshot was recorded with; None reads whatever the store holds."""
        self._manifest: Manifest | None = None
        self._lock: StoreLock | None = None
        self._opened: dict[str, StoredFile] = {}
        self._guard = threading.Lock()

    @property
    def manifest(self) -> Manifest:
        """The snapshot's manifest; SnapshotNotFound or SnapshotCorrupt if there is no good one
        (ManifestMismatch if it is not the one recorded)."""
        with self._guard:
            if self._manifest is None:
                lock = self.store._lock(LockKind.SHARED, f"read {self.snapshot_id}")
                try:
                    self._manifest = self.store.manifest(self.snapshot_id, self.digest)
                except BaseException:
                    lock.release()
                    raise
                self._lock = lock
            return self._manifest

    def fetch(
        self, dest: str | os.PathLike[str], *, leave_out: Callable[[str], object] = lambda path: False
    ) -> Manifest:
        """As `SnapshotStore.fetch`."""
        target = Path(dest)
        if target.exists() or target.is_symlink():  # before any lock or read of the store
            raise FileExistsError(f"fetch destination {target} already exists")
        manifest = self.manifest
        build_tree(self.store._chunks, manifest, dest, leave_out)
        return manifest

    def open(self, path: str) -> StoredFile:
        """One regular file, to read at any offset (`StoredFile`); FileNotFoundError if the
        snapshot has no such file."""
        manifest = self.manifest
        with self._guard:
            if path not in self._opened:
                entry = file_entry(manifest, path)
                self._opened[path] = StoredFile(self.store._chunks, self.snapshot_id, entry, None)
            return self._opened[path]

    def unlock(self) -> None:
        """Release the store lock and read on without it: for a reader that lives as long as a
        fork child's held memory, which may be hours, where the lock would keep garbage
        collection off the whole store. The caller vouches that nothing collects the snapshot
        meanwhile (the control plane keeps a fork's snapshot while any child of it lives); a
        chunk gone anyway reads as SnapshotCorrupt, never as wrong bytes."""
        with self._guard:
            lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def close(self) -> None:
        """Close every file opened here and release the lock."""
        with self._guard:
            opened, self._opened = self._opened, {}
            lock, self._lock = self._lock, None
        for f in opened.values():
            f.close()
        if lock is not None:
            lock.release()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
