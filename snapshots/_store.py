"""SnapshotStore: put, fetch, inspect and delete snapshots in a chunk store over one backend; the
store's entry point, which hands a put's tree and parent to `_put` and a fetch to `_reader`."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from . import _archive, _gc, _history, _verify
from ._backends import Backend, ObjectMissing, open_backend
from ._chunking import describe
from ._chunkstore import ChunkStore
from ._deltas import DELTA_FILE_BYTES, Aligner
from ._errors import (
    ManifestMismatch,
    SnapshotCorrupt,
    SnapshotExists,
    SnapshotNotFound,
)
from ._layout import (
    EPISODE_PREFIX,
    MANIFEST_PREFIX,
    episode_key,
    manifest_id,
    manifest_key,
    split_episode_key,
)
from ._locks import LockKind, StoreLock
from ._manifest import (
    Entry,
    EntryKind,
    Manifest,
    SnapshotMeta,
    manifest_digest,
    valid_id,
    validate_meta,
)
from ._manifest_json import decode, encode
from ._put import check_parent, committed, parent_files, scan
from ._random import StoredFile
from ._reader import SnapshotReader, file_entry
from ._settings import StoreSettings


class SnapshotStore:
    """Content-addressed, deduplicating snapshot store over a local directory or S3.

    Thread-safe; one instance per process is enough. Close it (or use it as a
    context manager) to stop its worker threads.
    """

    def __init__(self, settings: StoreSettings) -> None:
        self._settings = settings
        self._backend: Backend = open_backend(settings)
        threads = settings.threads_for(remote=self._backend.remote)
        self._chunks = ChunkStore(self._backend, settings.chunking, threads, settings.pack_bytes)

    @classmethod
    def open(cls, store: str | StoreSettings) -> SnapshotStore:
        """Open a store from a URL (file:///path, s3://bucket/prefix?endpoint=...) or settings."""
        return cls(store if isinstance(store, StoreSettings) else StoreSettings(url=store))

    @property
    def settings(self) -> StoreSettings:
        """The settings this store was opened with."""
        return self._settings

    def close(self) -> None:
        """Stop worker threads and release connections."""
        self._chunks.close()
        self._backend.close()

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _lock(self, kind: LockKind, purpose: str) -> StoreLock:
        locks = self._settings.locks
        timeout = locks.gc_acquire_timeout_s if kind is LockKind.EXCLUSIVE else locks.acquire_timeout_s
        return StoreLock(self._backend, locks, kind, purpose).acquire(timeout)

    # -- writing -----------------------------------------------------------------------------

    def put(
        self, checkpoint_dir: str | os.PathLike[str], meta: SnapshotMeta, *, aligner: Aligner | None = None
    ) -> Manifest:
        """Store a checkpoint directory as an immutable snapshot and return its manifest.

        Metadata is validated before anything is written. Chunks go first and
        the manifest last, in one atomic create; a put that dies before that
        leaves no visible snapshot. With a parent, changed chunks are stored as
        deltas against the parent's where that saves most of them; `aligner`
        says where a file's bytes sat in the parent, if not in place (`Aligner`).
        Raises InvalidSnapshotMeta, InvalidCheckpoint, SnapshotExists,
        StoreLocked or a StoreError.
        """
        started = time.monotonic()
        validate_meta(meta)
        root = Path(checkpoint_dir)
        tree = scan(root)
        if self._backend.size(manifest_key(meta.snapshot_id)) is not None:
            raise SnapshotExists(meta.snapshot_id)
        parent = check_parent(meta, self.manifest) if meta.parent_id is not None else None
        self._backend.ensure_exclusive_create()  # Publishing relies on it: refuse before writing.

        waiting = time.monotonic()
        with self._lock(LockKind.SHARED, f"put {meta.snapshot_id}") as lock:
            locked = time.monotonic()
            # The marker goes before any chunk: a put killed later leaves a marker without a
            # manifest, which listings skip and GC removes, never a manifest nobody lists.
            self._backend.put(episode_key(meta.episode_id, meta.snapshot_id), b"")
            # The parent's chunks are reused only if it is still there now that GC is kept away.
            if parent is not None and not self.exists(parent.snapshot_id):
                parent = None
            bases = parent_files(self._chunks, parent, root, aligner)
            files = [
                (root / path, size, bases(path) if size >= DELTA_FILE_BYTES else None)
                for path, kind, _m, size, _t in tree
                if kind is EntryKind.FILE
            ]
            reusable = (ref for e in parent.files() for ref in e.chunks) if parent is not None else ()
            lists, tally = self._chunks.store_files(files, reusable)
            chunk_lists = iter(lists)
            entries = tuple(
                Entry(path, kind, mode, size, next(chunk_lists) if kind is EntryKind.FILE else (), target)
                for path, kind, mode, size, target in tree
            )
            self._backend.flush()
            uploaded = time.monotonic()
            timings = dict(meta.timings_ms)
            timings["store_prepare"] = round((waiting - started) * 1000, 3)
            timings["store_lock"] = round((locked - waiting) * 1000, 3)
            timings["store_upload"] = round((uploaded - locked) * 1000, 3)
            manifest = committed(meta, entries, tally, describe(self._settings.chunking), timings)
            # A lock that may have gone stale could mean a sweep ran under us: do not publish.
            lock.ensure_held()
            raw = encode(manifest)
            if not self._backend.put_if_absent(manifest_key(meta.snapshot_id), raw):
                raise SnapshotExists(meta.snapshot_id)
        return replace(manifest, digest=manifest_digest(raw))

    # -- reading -----------------------------------------------------------------------------

    def manifest(self, snapshot_id: str, digest: str | None = None) -> Manifest:
        """The manifest of a committed snapshot; SnapshotNotFound or SnapshotCorrupt otherwise.

        With `digest` (`Manifest.digest`, as recorded when the snapshot was taken), the stored
        bytes are checked against it before any of them is parsed: ManifestMismatch if the store
        holds others. Every chunk the manifest names is checked against its hash as it is read,
        so a checked manifest vouches for all of the snapshot."""
        if not valid_id(snapshot_id):
            raise SnapshotNotFound(snapshot_id)
        try:
            raw = self._backend.get(manifest_key(snapshot_id))
        except ObjectMissing:
            raise SnapshotNotFound(snapshot_id) from None
        if digest is not None and (found := manifest_digest(raw)) != digest:
            raise ManifestMismatch(snapshot_id, digest, found)
        return decode(raw, snapshot_id)

    def exists(self, snapshot_id: str) -> bool:
        """Whether a committed snapshot has this id."""
        return valid_id(snapshot_id) and self._backend.size(manifest_key(snapshot_id)) is not None

    def fetch(
        self,
        snapshot_id: str,
        dest: str | os.PathLike[str],
        *,
        leave_out: Callable[[str], object] = lambda path: False,
        digest: str | None = None,
    ) -> Manifest:
        """Recreate a snapshot's tree at dest (which must not exist), verifying every chunk; with
        `digest`, only if its manifest is the one recorded (as `manifest`).

        The tree is built beside dest and renamed into place, so dest appears
        complete or not at all. Raises SnapshotNotFound or SnapshotCorrupt
        naming the snapshot, file and chunk. The files whose paths `leave_out` holds true for
        are made at their size but left unwritten (holes), for the caller to fill from
        `open_file` as it needs them.
        """
        with self.reader(snapshot_id, digest) as reader:
            return reader.fetch(dest, leave_out=leave_out)

    def reader(self, snapshot_id: str, digest: str | None = None) -> SnapshotReader:
        """One snapshot, to fetch and to read at any offset from any thread under one shared
        lock (`SnapshotReader`); with `digest`, only if its manifest is the one recorded (as
        `manifest`)."""
        return SnapshotReader(self, snapshot_id, digest)

    def read_file(self, snapshot_id: str, path: str, dest: str | os.PathLike[str]) -> None:
        """Write one regular file of a snapshot to dest, verifying every chunk of it; SnapshotNotFound
        if there is no such snapshot, FileNotFoundError if it has no such file."""
        with self._lock(LockKind.SHARED, f"read {snapshot_id}"):
            entry = file_entry(self.manifest(snapshot_id), path)
            with open(dest, "wb") as f:
                f.truncate(entry.size)
            self._chunks.restore_files(snapshot_id, [(entry, Path(dest))])

    def open_file(self, snapshot_id: str, path: str, *, read_ahead: bool = True) -> StoredFile:
        """One regular file of a snapshot, to read at any offset, each chunk verified as it is
        read (`StoredFile`). It holds a shared lock on the store until closed. Without
        `read_ahead`, a read fetches the chunks under it and no more: for reads that skip about
        (a member of an archive found by its headers)."""
        lock = self._lock(LockKind.SHARED, f"read {snapshot_id}:{path}")
        try:
            entry = file_entry(self.manifest(snapshot_id), path)
        except BaseException:
            lock.release()
            raise
        return StoredFile(self._chunks, snapshot_id, entry, lock, read_ahead)

    # -- history and housekeeping -------------------------------------------------------------

    def episodes(self) -> list[str]:
        """Ids of episodes that have snapshot markers in the store, sorted."""
        return sorted({m[0] for key in self._backend.list(EPISODE_PREFIX) if (m := split_episode_key(key))})

    def history(self, episode_id: str) -> list[_history.SnapshotInfo]:
        """Committed snapshots of an episode in seq order, with lineage and sizes."""
        if not valid_id(episode_id):
            return []
        ids = [
            m[1]
            for key in self._backend.list(f"{EPISODE_PREFIX}{episode_id}/")
            if (m := split_episode_key(key))
        ]
        manifests = [m for m in self._chunks.map(self._manifest_or_none, ids) if m is not None]
        return _history.build(manifests)

    def _manifest_or_none(self, snapshot_id: str) -> Manifest | None:
        try:
            return self.manifest(snapshot_id)
        except SnapshotNotFound:
            return None

    def delete(self, snapshot_id: str) -> None:
        """Remove a snapshot: its manifest now, its unshared chunks at the next GC."""
        try:
            episode_id: str | None = self.manifest(snapshot_id).episode_id
        except SnapshotCorrupt:
            episode_id = None  # GC removes the marker once it finds no manifest behind it.
        self._backend.delete([manifest_key(snapshot_id)])
        if episode_id is not None:
            self._backend.delete([episode_key(episode_id, snapshot_id)])

    def verify(self, snapshot_id: str | None = None) -> _verify.VerifyReport:
        """Check one snapshot, or every manifest in the store, reading and hashing every chunk.

        Returns every problem found (missing chunk, hash mismatch, unreadable
        manifest) rather than stopping at the first.
        """
        with self._lock(LockKind.SHARED, "verify"):
            if snapshot_id is not None:
                ids = [snapshot_id]
            else:
                ids = sorted(
                    found for key in self._backend.list(MANIFEST_PREFIX) if (found := manifest_id(key))
                )
            return _verify.run(ids, self.manifest, self._chunks, single=snapshot_id is not None)

    def gc(
        self,
        retention: _gc.RetentionPolicy,
        ended_episodes: Collection[str] = (),
        resume_points: Mapping[str, str] | None = None,
        pending: Collection[str] = (),
    ) -> _gc.GcReport:
        """Apply retention and mark the chunks snapshots refer to, beside puts and restores (a
        shared lock); then sweep chunks no manifest refers to, under the exclusive lock, which
        is held only to check what was published since the mark and to delete what a put could
        find (loose chunks, the indexes of dead packs); then delete the dead packs' data under a
        shared lock again.

        ended_episodes are episodes whose trajectories are persisted elsewhere;
        all their snapshots go but those a live episode may still restore. resume_points names,
        per live episode, the snapshot it would resume from: it and those before it that
        `keep_last` allows stay, however many newer ones there are; it stays even if another
        episode took it (a fork child's is its parent's). pending names snapshots still being
        taken: they stay. Raises StoreLocked if writers keep the store
        busy for longer than LockSettings.gc_acquire_timeout_s; retention has been applied then.
        """
        with self._lock(LockKind.SHARED, "gc mark"):
            marked = _gc.mark(
                self._backend,
                self._chunks,
                self._settings.locks,
                retention,
                frozenset(ended_episodes),
                self._manifest_or_none,
                resume_points,
                pending,
            )
        with self._lock(LockKind.EXCLUSIVE, "gc sweep") as lock:
            swept = _gc.sweep(self._backend, self._chunks, lock, marked, self._manifest_or_none)
        with self._lock(LockKind.SHARED, "gc remove") as lock:
            return _gc.remove(self._backend, self._chunks, self._settings.locks, lock, swept)

    # -- archives ----------------------------------------------------------------------------

    def export_archive(
        self, snapshot_id: str, dest: str | os.PathLike[str], digest: str | None = None
    ) -> Path:
        """Write a snapshot as a standard container checkpoint archive (see export_checkpoint_archive);
        with `digest`, only if its manifest is the one recorded (as `manifest`)."""
        target = Path(dest)
        with tempfile.TemporaryDirectory(prefix=".stasis-export-", dir=target.parent) as scratch:
            tree = Path(scratch) / "checkpoint"
            self.fetch(snapshot_id, tree, digest=digest)
            return _archive.export_checkpoint_archive(tree, target)
