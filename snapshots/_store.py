"""SnapshotStore: put, fetch, inspect and delete snapshots in a chunk store over one backend."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from . import _archive, _gc, _history, _verify
from ._backends import Backend, ObjectMissing, open_backend
from ._chunking import ChunkMismatch, describe
from ._chunkstore import ChunkStore
from ._deltas import DELTA_FILE_BYTES, Aligner, ParentFile
from ._errors import (
    InvalidCheckpoint,
    InvalidSnapshotMeta,
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
    Reason,
    SnapshotMeta,
    SnapshotSizes,
    manifest_digest,
    valid_id,
    validate_meta,
)
from ._manifest_json import decode, encode
from ._random import StoredFile
from ._settings import StoreSettings

log = logging.getLogger(__name__)


def _scan(root: Path) -> list[tuple[str, EntryKind, int, int, str | None]]:
    """(path, kind, mode, size, link target) of every entry under root, parents before children."""
    if not root.is_dir():
        raise InvalidCheckpoint(str(root), "not a directory")
    found: list[tuple[str, EntryKind, int, int, str | None]] = []

    def walk(directory: Path, prefix: str) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise InvalidCheckpoint(str(directory), f"cannot list: {exc.strerror or exc}") from None
        for name in names:
            path = directory / name
            rel = prefix + name
            try:
                st = path.lstat()
                target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            except OSError as exc:
                raise InvalidCheckpoint(str(path), f"cannot read: {exc.strerror or exc}") from None
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                found.append((rel, EntryKind.DIR, mode, 0, None))
                walk(path, rel + "/")
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, EntryKind.FILE, mode, st.st_size, None))
            elif target is not None:
                found.append((rel, EntryKind.SYMLINK, mode, 0, target))
            else:
                raise InvalidCheckpoint(
                    str(path), "only directories, regular files and symlinks can be stored"
                )

    walk(root, "")
    return found


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
        tree = _scan(root)
        if self._backend.size(manifest_key(meta.snapshot_id)) is not None:
            raise SnapshotExists(meta.snapshot_id)
        parent = self._check_parent(meta) if meta.parent_id is not None else None
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
            bases = self._parent_files(parent, root, aligner)
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
            refs = [c for e in entries for c in e.chunks]
            manifest = Manifest(
                snapshot_id=meta.snapshot_id,
                episode_id=meta.episode_id,
                seq=meta.seq,
                parent_id=meta.parent_id,
                node=meta.node,
                reason=Reason(meta.reason),
                created_at=meta.created_at,
                image_digest=meta.image_digest,
                runtime_backend=meta.runtime_backend,
                criu_version=meta.criu_version,
                trajectory_cursor=meta.trajectory_cursor,
                timings_ms=timings,
                sizes=SnapshotSizes(
                    logical_bytes=sum(e.size for e in entries),
                    stored_bytes=tally.stored_bytes,
                    new_bytes=tally.new_bytes,
                    chunks=len(refs),
                    unique_chunks=tally.unique_chunks,
                    new_chunks=tally.new_chunks,
                ),
                chunking=describe(self._settings.chunking),
                entries=entries,
            )
            # A lock that may have gone stale could mean a sweep ran under us: do not publish.
            lock.ensure_held()
            raw = encode(manifest)
            if not self._backend.put_if_absent(manifest_key(meta.snapshot_id), raw):
                raise SnapshotExists(meta.snapshot_id)
        return replace(manifest, digest=manifest_digest(raw))

    def _check_parent(self, meta: SnapshotMeta) -> Manifest:
        try:
            parent = self.manifest(meta.parent_id or "")
        except SnapshotNotFound:
            raise InvalidSnapshotMeta("parent_id", f"no snapshot {meta.parent_id!r} in the store") from None
        if parent.episode_id != meta.episode_id:
            raise InvalidSnapshotMeta("parent_id", f"parent belongs to episode {parent.episode_id!r}")
        if parent.seq >= meta.seq:
            raise InvalidSnapshotMeta("seq", f"must exceed the parent's seq {parent.seq}")
        return parent

    def _parent_files(
        self, parent: Manifest | None, root: Path, aligner: Aligner | None
    ) -> Callable[[str], ParentFile | None]:
        """The parent's copy of each file to store, by path, to find delta bases in. A parent
        that cannot be read, or an aligner that fails on it, costs deltas, never the put."""
        if parent is None:
            return lambda path: None
        files = {e.path: e for e in parent.files()}

        def read(path: str) -> bytes | None:
            entry = files.get(path)
            if entry is None:
                return None
            try:
                return b"".join(self._chunks.read_chunk(ref) for ref in entry.chunks)
            except ChunkMismatch as exc:
                log.warning(
                    "snapshot %s: %s is unreadable (%s), so not aligned", parent.snapshot_id, path, exc
                )
                return None

        try:
            aligned = aligner(root, read) if aligner is not None else {}
        except ValueError as exc:
            log.warning("snapshot %s cannot be aligned with its parent (%s)", parent.snapshot_id, exc)
            aligned = {}

        def parent_file(path: str) -> ParentFile | None:
            alignment = aligned.get(path)
            entry = files.get(alignment.parent_path if alignment is not None else path)
            if entry is None:
                return None
            return ParentFile(entry, alignment.segments if alignment is not None else None)

        return parent_file

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

    def _build_tree(
        self, manifest: Manifest, dest: str | os.PathLike[str], leave_out: Callable[[str], object]
    ) -> None:
        """`fetch`'s work, under the caller's lock."""
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
            self._chunks.restore_files(manifest.snapshot_id, files)
            # Modes last, deepest first, so read-only files and dirs do not block their own filling.
            for entry in reversed(manifest.entries):
                if entry.kind is not EntryKind.SYMLINK:
                    os.chmod(work / entry.path, entry.mode)
            os.rename(work, target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def read_file(self, snapshot_id: str, path: str, dest: str | os.PathLike[str]) -> None:
        """Write one regular file of a snapshot to dest, verifying every chunk of it; SnapshotNotFound
        if there is no such snapshot, FileNotFoundError if it has no such file."""
        with self._lock(LockKind.SHARED, f"read {snapshot_id}"):
            entry = _file_entry(self.manifest(snapshot_id), path)
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
            entry = _file_entry(self.manifest(snapshot_id), path)
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
        all their snapshots go. resume_points names, per live episode, the snapshot it would
        resume from: it and those before it that `keep_last` allows stay, however many newer
        ones there are. pending names snapshots still being taken: they stay. Raises StoreLocked if writers keep the store
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


def _file_entry(manifest: Manifest, path: str) -> Entry:
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
        self.store._build_tree(manifest, dest, leave_out)
        return manifest

    def open(self, path: str) -> StoredFile:
        """One regular file, to read at any offset (`StoredFile`); FileNotFoundError if the
        snapshot has no such file."""
        manifest = self.manifest
        with self._guard:
            if path not in self._opened:
                entry = _file_entry(manifest, path)
                self._opened[path] = StoredFile(self.store._chunks, self.snapshot_id, entry, None)
            return self._opened[path]

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
