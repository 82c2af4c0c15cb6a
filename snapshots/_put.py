"""What a put works out around storing its chunks: the checkpoint tree it reads, the parent it
names, the parent's files it may store deltas against, and the manifest it publishes."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._chunking import ChunkMismatch
from ._chunkstore import ChunkStore
from ._deltas import Aligner, ParentFile
from ._errors import InvalidCheckpoint, InvalidSnapshotMeta, SnapshotNotFound
from ._manifest import Entry, EntryKind, Manifest, Reason, SnapshotMeta, SnapshotSizes
from ._uploads import UploadTally

log = logging.getLogger(__name__)

Scanned = tuple[str, EntryKind, int, int, str | None]
"""One entry of a checkpoint tree: path, kind, mode, size and link target."""


def scan(root: Path) -> list[Scanned]:
    """(path, kind, mode, size, link target) of every entry under root, parents before children."""
    if not root.is_dir():
        raise InvalidCheckpoint(str(root), "not a directory")
    found: list[Scanned] = []

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


def check_parent(meta: SnapshotMeta, manifest: Callable[[str], Manifest]) -> Manifest:
    """The parent `meta` names, if it is an older snapshot of the same episode; InvalidSnapshotMeta if not."""
    try:
        parent = manifest(meta.parent_id or "")
    except SnapshotNotFound:
        raise InvalidSnapshotMeta("parent_id", f"no snapshot {meta.parent_id!r} in the store") from None
    if parent.episode_id != meta.episode_id:
        raise InvalidSnapshotMeta("parent_id", f"parent belongs to episode {parent.episode_id!r}")
    if parent.seq >= meta.seq:
        raise InvalidSnapshotMeta("seq", f"must exceed the parent's seq {parent.seq}")
    return parent


def parent_files(
    chunks: ChunkStore, parent: Manifest | None, root: Path, aligner: Aligner | None
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
            return b"".join(chunks.read_chunk(ref) for ref in entry.chunks)
        except ChunkMismatch as exc:
            log.warning("snapshot %s: %s is unreadable (%s), so not aligned", parent.snapshot_id, path, exc)
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


def committed(
    meta: SnapshotMeta,
    entries: tuple[Entry, ...],
    tally: UploadTally,
    chunking: Mapping[str, Any],
    timings_ms: Mapping[str, float],
) -> Manifest:
    """The manifest a put publishes once its chunks are stored."""
    refs = [c for e in entries for c in e.chunks]
    return Manifest(
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
        timings_ms=timings_ms,
        sizes=SnapshotSizes(
            logical_bytes=sum(e.size for e in entries),
            stored_bytes=tally.stored_bytes,
            new_bytes=tally.new_bytes,
            chunks=len(refs),
            unique_chunks=tally.unique_chunks,
            new_chunks=tally.new_chunks,
        ),
        chunking=chunking,
        entries=entries,
    )
