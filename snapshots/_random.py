"""Reading one stored file at any offset, without fetching the rest of it (lazy restore).

A file's chunk list is its index: chunk i starts where the lengths before it end. A read fetches
only the chunks that cover its range, in one request where they lie together in a pack, and
verifies each against its hash before any byte of it is returned. Recently read chunks are kept,
decoded, so neighbouring reads do not fetch them again, and the chunks after a read are fetched
and verified ahead on the store's threads, since reads mostly go forward (unless the file was
opened for reads that skip about, such as a walk through a tar's headers).
"""

from __future__ import annotations

import bisect
import io
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, wait
from types import TracebackType
from typing import TYPE_CHECKING

from ._chunking import ChunkMismatch
from ._chunkstore import ChunkStore, follows, verified
from ._locks import StoreLock
from ._manifest import ChunkRef, Entry, chunk_lengths

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

CACHED_CHUNKS = 256
"""Decoded chunks kept per open file: 16 MiB at the 64 KiB average chunk."""
READ_AHEAD_CHUNKS = 128
"""Chunks fetched ahead of the last read (2 MiB at the average chunk), in runs of up to 8."""
_AHEAD_RUN = 16


class StoredFile:
    """One regular file of a snapshot, open for reads at any offset (`SnapshotStore.open_file`).

    Holds a shared lock on the store until closed (or its `SnapshotReader` holds one), so
    garbage collection leaves its chunks be. Thread-safe."""

    def __init__(
        self,
        chunks: ChunkStore,
        snapshot_id: str,
        entry: Entry,
        lock: StoreLock | None,
        read_ahead: bool = True,
    ) -> None:
        self.snapshot_id = snapshot_id
        self.path = entry.path
        self.size = entry.size
        self._chunks = chunks
        self._refs = entry.chunks
        self._starts = [0, *itertools.accumulate(chunk_lengths(entry.chunks))][:-1]
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._ahead: dict[int, tuple[Future[list[bytes | ChunkMismatch]], int]] = {}
        """Chunks being read ahead: the run's future, and the chunk's place in it."""
        self._guard = threading.Lock()
        self._lock = lock
        self._ahead_chunks = READ_AHEAD_CHUNKS if read_ahead else 0
        self.fetched_bytes = 0
        """Raw bytes of the chunks fetched so far (a chunk read twice counts twice)."""

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes from `offset`, every chunk of them verified; SnapshotCorrupt names the
        chunk that is missing or does not match its hash."""
        return b"".join(self.read_views(offset, length))

    def read_views(self, offset: int, length: int) -> list[memoryview]:
        """What `read` gives, as views of the verified chunks it lies in, one after another: no
        byte is copied, for a caller that sends them on as they are (a lazy restore's pages)."""
        first, last = self._span(offset, length)
        if length == 0:
            return []
        chunks = self._load(range(first, last + 1))
        self._read_ahead(last + 1)
        return _views(chunks, offset - self._starts[first], length)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each (offset, length) of `ranges`, as `read` gives it. The chunks under all of them are
        fetched at once, their runs side by side on the store's threads, and none ahead: for
        reads known in advance and scattered over the file."""
        spans = [self._span(offset, length) for offset, length in ranges]
        wanted = sorted(
            {
                i
                for (first, last), (_, n) in zip(spans, ranges, strict=True)
                if n
                for i in range(first, last + 1)
            }
        )
        found = dict(zip(wanted, self._load(wanted, side_by_side=True), strict=True))
        return [
            b"".join(_views([found[i] for i in range(first, last + 1)], offset - self._starts[first], length))
            if length
            else b""
            for (offset, length), (first, last) in zip(ranges, spans, strict=True)
        ]

    def _span(self, offset: int, length: int) -> tuple[int, int]:
        """The first and last chunk under a range (a valid one)."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(
                f"{self.path}: cannot read {length} bytes at {offset} of a {self.size}-byte file"
            )
        first = bisect.bisect_right(self._starts, offset) - 1
        return first, bisect.bisect_right(self._starts, offset + max(length, 1) - 1) - 1

    def _load(self, wanted: Sequence[int], side_by_side: bool = False) -> list[bytes]:
        with self._guard:
            found = {i: self._cache[i] for i in wanted if i in self._cache}
            for i in found:
                self._cache.move_to_end(i)
            ahead = {i: self._ahead.pop(i) for i in wanted if i not in found and i in self._ahead}
        for i, (future, at) in ahead.items():
            found[i] = self._checked(i, future.result()[at])
        missing = [i for i in wanted if i not in found]
        runs = _runs(missing, self._refs)
        if side_by_side and len(runs) > 1:
            later = [(run, self._chunks.read_later([self._refs[i] for i in run])) for run in runs]
            raws = [(run, future.result()) for run, future in later]
        else:
            raws = [(run, self._chunks.read_run([self._refs[i] for i in run])) for run in runs]
        for run, raw in raws:
            for i, chunk in zip(run, raw, strict=True):
                found[i] = self._checked(i, chunk)
        missing += ahead
        with self._guard:
            for i in missing:
                self._cache[i] = found[i]
            while len(self._cache) > CACHED_CHUNKS:
                self._cache.popitem(last=False)
        return [found[i] for i in wanted]

    def _checked(self, i: int, raw: bytes | ChunkMismatch) -> bytes:
        ref = self._refs[i]
        chunk = verified(self.snapshot_id, self.path, ref, raw)
        self.fetched_bytes += ref.length
        return chunk

    def _read_ahead(self, start: int) -> None:
        """Have the chunks from `start` on read on the store's threads, those not had already."""
        with self._guard:
            todo = [
                i
                for i in range(start, min(start + self._ahead_chunks, len(self._refs)))
                if i not in self._cache and i not in self._ahead
            ]
            for run in _runs(todo, self._refs):
                for part in range(0, len(run), _AHEAD_RUN):
                    chunk_ids = run[part : part + _AHEAD_RUN]
                    future = self._chunks.read_later([self._refs[i] for i in chunk_ids])
                    for at, i in enumerate(chunk_ids):
                        self._ahead[i] = (future, at)

    def stream(self) -> io.BufferedReader:
        """The file as a seekable binary stream, for a reader that wants one (`tarfile`); each
        read fetches what `read` would. Closing it leaves this file open."""
        return io.BufferedReader(_Stream(self), buffer_size=_STREAM_BUFFER)

    def close(self) -> None:
        with self._guard:
            pending, self._ahead = self._ahead, {}
        for future, _ in pending.values():
            future.cancel()
        wait([f for f, _ in pending.values()])
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> StoredFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_STREAM_BUFFER = 4096
"""Bytes a stream reads at a time for small reads (a tar header is 512): it costs nothing to
fetch, since the chunk under it is fetched whole anyway."""


class _Stream(io.RawIOBase):
    """A `StoredFile` read from a position that moves, as a file is."""

    def __init__(self, stored: StoredFile) -> None:
        self._stored = stored
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._stored.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self._stored.path}: cannot seek to {base + offset}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: WriteableBuffer) -> int:
        target = memoryview(buffer).cast("B")
        length = max(0, min(len(target), self._stored.size - self._position))
        done = 0
        for view in self._stored.read_views(min(self._position, self._stored.size), length):
            target[done : done + len(view)] = view
            done += len(view)
        self._position += done
        return done


def _views(chunks: list[bytes], at: int, length: int) -> list[memoryview]:
    """`length` bytes from `at` in the chunks laid end to end (the first holds `at`; the last,
    the range's end), as views of them."""
    views = []
    for chunk in chunks:
        view = memoryview(chunk)[at : at + length]
        views.append(view)
        length -= len(view)
        at = 0
    return views


def _runs(indexes: list[int], refs: Sequence[ChunkRef]) -> list[list[int]]:
    """Consecutive chunks that lie one after another in one pack, so each run is one request."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and i == runs[-1][-1] + 1 and follows(refs[runs[-1][-1]], refs[i]):
            runs[-1].append(i)
            continue
        runs.append([i])
    return runs
