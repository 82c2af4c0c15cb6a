"""Moving file content in and out of the content-addressed chunk space, in parallel and verified."""

from __future__ import annotations

import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ._backends import Backend, ObjectMissing
from ._chunking import ChunkCodec, ChunkMismatch, chunk_key, cut_points
from ._errors import InvalidCheckpoint, SnapshotCorrupt
from ._manifest import ChunkRef, Entry
from ._settings import ChunkingSettings

T = TypeVar("T")
R = TypeVar("R")


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
    """Per-put bookkeeping of which chunks were seen, their stored sizes and which were new."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stored: dict[str, int] = {}
        self.new: set[str] = set()
        self.claimed: set[str] = set()


class ChunkStore:
    """Chunk-level operations over a backend, with a small thread pool doing hashing, zstd and I/O."""

    def __init__(self, backend: Backend, chunking: ChunkingSettings, io_threads: int) -> None:
        self._backend = backend
        self._chunking = chunking
        self._codec = ChunkCodec(chunking.compression_level)
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="stasis-chunks")
        # Enough work queued to keep every thread busy while the producer cuts the next chunks,
        # small enough that buffered compressed chunks stay in the low megabytes.
        self._window = io_threads * 4

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=True)

    def _windowed(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items on the pool, at most a window in flight, results in input order."""
        results: list[R] = []
        pending: deque[Future[R]] = deque()
        try:
            for item in items:
                pending.append(self._pool.submit(fn, item))
                if len(pending) >= self._window:
                    results.append(pending.popleft().result())
            while pending:
                results.append(pending.popleft().result())
        except BaseException:
            for future in pending:
                future.cancel()
            # Running tasks still touch mappings and files the caller is about to drop.
            wait(pending)
            raise
        return results

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """Run fn over items on the chunk pool (for manifest reads and similar fan-outs)."""
        return self._windowed(fn, items)

    # -- writing -----------------------------------------------------------------------------

    def store_files(
        self, files: Sequence[tuple[Path, int]]
    ) -> tuple[list[tuple[ChunkRef, ...]], UploadTally]:
        """Chunk, deduplicate and upload each (path, size); returns chunk lists in the same order."""
        uploads = _Uploads()
        cuts: list[list[tuple[int, int]]] = [[] for _ in files]
        mapped: list[_MappedFile] = []

        def work() -> Generator[tuple[_MappedFile, int, int]]:
            for index, (path, size) in enumerate(files):
                if size == 0:
                    continue
                try:
                    mf = _MappedFile(path, size)
                except OSError as exc:
                    raise InvalidCheckpoint(str(path), f"cannot read: {exc.strerror or exc}") from None
                mapped.append(mf)
                try:
                    for offset, length in cut_points(mf.view, self._chunking):
                        cuts[index].append((offset, length))
                        mf.retain()
                        yield mf, offset, length
                finally:
                    mf.release()

        def upload(item: tuple[_MappedFile, int, int]) -> str:
            mf, offset, length = item
            piece = mf.view[offset : offset + length]
            try:
                return self._upload_chunk(piece, uploads)
            finally:
                piece.release()
                mf.release()

        producer = work()
        try:
            digests = iter(self._windowed(upload, producer))
        finally:
            producer.close()
            # After a failure, cancelled tasks never drop their references; every task has ended.
            for mf in mapped:
                mf.close()
        chunk_lists = [
            tuple(
                ChunkRef(d, length, uploads.stored[d])
                for (_offset, length), d in zip(file_cuts, digests, strict=False)
            )
            for file_cuts in cuts
        ]
        tally = UploadTally(
            stored_bytes=sum(uploads.stored.values()),
            new_bytes=sum(uploads.stored[d] for d in uploads.new),
            unique_chunks=len(uploads.stored),
            new_chunks=len(uploads.new),
        )
        return chunk_lists, tally

    def _upload_chunk(self, piece: memoryview, uploads: _Uploads) -> str:
        digest = self._codec.digest(piece)
        with uploads.lock:
            if digest in uploads.claimed:
                return digest  # Another task of this put owns it (zero pages repeat a lot).
            uploads.claimed.add(digest)
        key = chunk_key(digest)
        stored = self._backend.size(key)
        new = stored is None
        if stored is None:
            blob = self._codec.encode(piece)
            self._backend.put(key, blob)
            stored = len(blob)
        with uploads.lock:
            uploads.stored[digest] = stored
            if new:
                uploads.new.add(digest)
        return digest

    # -- reading -----------------------------------------------------------------------------

    def read_chunk(self, ref: ChunkRef) -> bytes:
        """Fetch and verify one chunk; raises ChunkMismatch (kind missing-chunk when absent)."""
        try:
            blob = self._backend.get(chunk_key(ref.hash))
        except ObjectMissing:
            raise ChunkMismatch("missing-chunk", "chunk object is missing from the store") from None
        return self._codec.decode(blob, ref.hash, ref.length)

    def restore_files(self, snapshot_id: str, targets: Sequence[tuple[Entry, Path]]) -> None:
        """Write each entry's content into its (already created, sized) target file, verifying every chunk."""

        def work() -> Iterable[tuple[Entry, Path, ChunkRef, int]]:
            for entry, path in targets:
                offset = 0
                for ref in entry.chunks:
                    yield entry, path, ref, offset
                    offset += ref.length

        def restore(item: tuple[Entry, Path, ChunkRef, int]) -> None:
            entry, path, ref, offset = item
            try:
                raw = self.read_chunk(ref)
            except ChunkMismatch as exc:
                raise SnapshotCorrupt(
                    snapshot_id, entry.path, ref.hash, f"{exc.kind}: {exc.detail}"
                ) from None
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                view = memoryview(raw)
                while view:
                    written = os.pwrite(fd, view, offset)
                    view = view[written:]
                    offset += written
            finally:
                os.close(fd)

        self._windowed(restore, work())

    def check(self, refs: Iterable[ChunkRef]) -> dict[tuple[str, int], ChunkMismatch | None]:
        """Read and verify each distinct (hash, length); None marks a good chunk."""
        distinct = list(dict.fromkeys((r.hash, r.length, r.stored_length) for r in refs))

        def probe(item: tuple[str, int, int]) -> ChunkMismatch | None:
            try:
                self.read_chunk(ChunkRef(*item))
            except ChunkMismatch as exc:
                return exc
            return None

        results = self._windowed(probe, distinct)
        return {(h, n): result for (h, n, _z), result in zip(distinct, results, strict=True)}
