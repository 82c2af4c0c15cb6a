"""A put's side of the chunk space: files cut into chunks on the chunk threads, each chunk kept
once (already in a pack, or the parent's), new ones stored plainly or as deltas against the
parent's copy, and packed."""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._backends import Backend
from ._chunking import ChunkCodec, ChunkMismatch, cut_points
from ._deltas import DELTA_AT_MOST, ParentFile, worth_a_delta
from ._errors import InvalidCheckpoint
from ._manifest import ChunkRef
from ._packs import Located, PackIndex, PackWriter
from ._settings import ChunkingSettings
from ._workers import BATCH_BYTES, ChunkThreads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadTally:
    """What one put moved: counts over the distinct chunks it referenced."""

    stored_bytes: int
    new_bytes: int
    unique_chunks: int
    new_chunks: int


class _MappedFile:
    """A read-only mapping shared by the chunk tasks of one file; unmapped when the last user is done."""

    def __init__(self, path: Path, expected_size: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size != expected_size:
                raise InvalidCheckpoint(
                    str(path), f"changed size while being stored ({expected_size} -> {size})"
                )
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        # Readers of page images go front to back once; let the kernel read ahead.
        self._map.madvise(mmap.MADV_SEQUENTIAL)
        self.view = memoryview(self._map)
        self._users = 1
        self._lock = threading.Lock()
        self._closed = False

    def retain(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.close()

    def close(self) -> None:
        """Unmap now; only safe once no task holds a slice of the view."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.view.release()
        self._map.close()


class _Uploads:
    """Per-put bookkeeping of which chunks were seen, where they lie and which were new; and the
    parent's chunks, which this put may reuse, delta chunks included."""

    def __init__(self, parent: Mapping[str, ChunkRef]) -> None:
        self.lock = threading.Lock()
        self.located: dict[str, Located] = {}
        self.new: set[str] = set()
        self.claimed: set[str] = set()
        self.parent = parent


class Uploader:
    """Stores the files of puts in a chunk store's packs."""

    def __init__(
        self,
        backend: Backend,
        chunking: ChunkingSettings,
        pack_bytes: int,
        codec: ChunkCodec,
        threads: ChunkThreads,
        read_base: Callable[[ChunkRef], bytes],
    ) -> None:
        self._backend = backend
        self._chunking = chunking
        self._packs = PackIndex(backend)
        self._pack_bytes = pack_bytes
        self._codec = codec
        self._threads = threads
        self._read_base = read_base
        """Reads and verifies a delta base, raising ChunkMismatch naming it."""

    def store_files(
        self, files: Sequence[tuple[Path, int, ParentFile | None]], parent: Iterable[ChunkRef] = ()
    ) -> tuple[list[tuple[ChunkRef, ...]], UploadTally]:
        """Chunk, deduplicate and pack each (path, size, the parent's copy); returns chunk lists in
        the same order. A chunk is reused if a pack or the `parent` snapshot's chunks have it; a new
        one is stored as a delta against its parent's copy where that is much smaller (`_deltas`).
        Call under the store lock: chunks are reused only from packs no GC can remove meanwhile,
        and the parent's only from a snapshot that exists."""
        self._packs.refresh()
        uploads = _Uploads({r.hash: r for r in parent})
        packs = PackWriter(self._backend, self._packs, self._pack_bytes)
        cuts: list[list[tuple[int, int]]] = [[] for _ in files]
        mapped: list[_MappedFile] = []

        def work() -> Generator[tuple[_MappedFile, list[tuple[int, int]], ParentFile | None]]:
            for index, (path, size, base_file) in enumerate(files):
                if size == 0:
                    continue
                try:
                    mf = _MappedFile(path, size)
                except OSError as exc:
                    raise InvalidCheckpoint(str(path), f"cannot read: {exc.strerror or exc}") from None
                mapped.append(mf)
                try:
                    batch: list[tuple[int, int]] = []
                    for offset, length in cut_points(mf.view, self._chunking):
                        cuts[index].append((offset, length))
                        batch.append((offset, length))
                        if offset + length - batch[0][0] >= BATCH_BYTES:
                            mf.retain()
                            yield mf, batch, base_file
                            batch = []
                    if batch:
                        mf.retain()
                        yield mf, batch, base_file
                finally:
                    mf.release()

        def upload(item: tuple[_MappedFile, list[tuple[int, int]], ParentFile | None]) -> list[str]:
            mf, batch, base_file = item
            try:
                return [
                    self._upload_chunk(mf.view, offset, length, uploads, packs, base_file)
                    for offset, length in batch
                ]
            finally:
                mf.release()

        producer = work()
        try:
            digests = iter([d for batch in self._threads.shared(upload, producer) for d in batch])
            packs.finish()
        except BaseException:
            packs.abort()
            raise
        finally:
            producer.close()
            # After a failure, cancelled tasks never drop their references; every task has ended.
            for mf in mapped:
                mf.close()
        chunk_lists = [
            tuple(
                _ref(d, length, uploads.located[d])
                for (_offset, length), d in zip(file_cuts, digests, strict=False)
            )
            for file_cuts in cuts
        ]
        bases = {
            at.base for at in uploads.located.values() if at.base and at.base.hash not in uploads.located
        }
        tally = UploadTally(
            stored_bytes=sum(at.stored_length for at in uploads.located.values())
            + sum(base.stored_length for base in bases),
            new_bytes=sum(uploads.located[d].stored_length for d in uploads.new),
            unique_chunks=len(uploads.located),
            new_chunks=len(uploads.new),
        )
        return chunk_lists, tally

    def _upload_chunk(
        self,
        view: memoryview,
        offset: int,
        length: int,
        uploads: _Uploads,
        packs: PackWriter,
        parent: ParentFile | None,
    ) -> str:
        with view[offset : offset + length] as piece:
            digest = self._codec.digest(piece)
            with uploads.lock:
                if digest in uploads.claimed:
                    return digest  # Another task of this put owns it (zero pages repeat a lot).
                uploads.claimed.add(digest)
            had = uploads.parent.get(digest)
            at = (
                self._packs.find(digest)
                if had is None
                else Located(had.pack, had.offset, had.stored_length, had.base)
            )
            stored = None if at is not None else self._encode(piece, offset, length, parent)
        new = at is None
        if stored is not None:
            at = packs.append(digest, length, *stored)
        assert at is not None
        with uploads.lock:
            uploads.located[digest] = at
            if new:
                uploads.new.add(digest)
        return digest

    def _encode(
        self, piece: memoryview, offset: int, length: int, parent: ParentFile | None
    ) -> tuple[bytes, ChunkRef | None]:
        """The stored form of a new chunk, and its base: a delta against the parent's copy of
        its bytes if that is much smaller, else the plain form and None."""
        blob = self._codec.encode(piece)
        base = parent.base_for(offset, length) if parent is not None else None
        if base is None:
            return blob, None
        try:
            raw = self._read_base(base.ref)
        except ChunkMismatch as exc:  # stored plainly; `verify` reports the base
            log.warning("chunk %s cannot be a delta base (%s: %s)", base.ref.hash, exc.kind, exc.detail)
            return blob, None
        if not worth_a_delta(piece, raw, base.shift):
            return blob, None
        delta = self._codec.encode_delta(piece, raw)
        return (delta, base.ref) if len(delta) <= len(blob) * DELTA_AT_MOST else (blob, None)


def _ref(digest: str, length: int, at: Located) -> ChunkRef:
    return ChunkRef(digest, length, at.stored_length, at.pack, at.offset, at.base)
