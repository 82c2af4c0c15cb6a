"""Moving file content in and out of the content-addressed chunk space, in parallel and verified."""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ._backends import Backend, ObjectMissing
from ._chunking import ChunkCodec, ChunkMismatch, chunk_key, cut_points
from ._deltas import DELTA_AT_MOST, ParentFile, worth_a_delta
from ._errors import InvalidCheckpoint, SnapshotCorrupt
from ._layout import pack_key
from ._manifest import ChunkRef, Entry
from ._packs import Located, PackIndex, PackWriter
from ._settings import ChunkingSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_BATCH_BYTES = 1 << 20
"""Chunks go to the pool a megabyte at a time: a task per 64 KiB chunk spends more on handing
work between threads than a 2-core node can spare."""

_ITEM_BYTES = 4 << 20
"""A restore gives each thread a file's next few megabytes at a time, so that a file is opened
once per few megabytes, not once per run of chunks."""

_REPEATS_KEPT_BYTES = 64 << 20
"""Raw bytes a restore keeps of chunks it has yet to write again (zero runs, pages shared
between processes); past this, a repeat is read again."""


@dataclass(frozen=True)
class _Piece:
    """Runs of chunks a restore writes into one file, one after another from `offset`."""

    entry: Entry
    path: Path
    offset: int
    runs: list[list[ChunkRef]]


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


class _Repeats:
    """The chunks one restore writes in more than one place, kept decoded from their first read
    until their last use, so each is fetched, decompressed and verified once."""

    def __init__(self, refs: Iterable[ChunkRef]) -> None:
        counts = Counter(ref.hash for ref in refs)
        self._left = {digest: n for digest, n in counts.items() if n > 1}
        self._kept: dict[str, bytes] = {}
        self._kept_bytes = 0
        self._lock = threading.Lock()

    def read(
        self, run: Sequence[ChunkRef], read_run: Callable[[Sequence[ChunkRef]], list[bytes | ChunkMismatch]]
    ) -> list[bytes | ChunkMismatch]:
        """Each chunk of run: kept ones from memory, the others through read_run."""
        if not self._left:
            return read_run(run)
        with self._lock:
            known = [self._kept.get(ref.hash) for ref in run]
        wanted = [ref for ref, raw in zip(run, known, strict=True) if raw is None]
        fresh = iter([raw for part in _adjacent(wanted) for raw in read_run(part)])
        out: list[bytes | ChunkMismatch] = [next(fresh) if raw is None else raw for raw in known]
        with self._lock:
            for ref, raw in zip(run, out, strict=True):
                self._used(ref.hash, raw)
        return out

    def _used(self, digest: str, raw: bytes | ChunkMismatch) -> None:
        left = self._left.get(digest)
        if left is None:
            return
        if left == 1:
            del self._left[digest]
            dropped = self._kept.pop(digest, None)
            self._kept_bytes -= len(dropped) if dropped is not None else 0
            return
        self._left[digest] = left - 1
        if (
            isinstance(raw, bytes)
            and digest not in self._kept
            and self._kept_bytes + len(raw) <= _REPEATS_KEPT_BYTES
        ):
            self._kept[digest] = raw
            self._kept_bytes += len(raw)


class ChunkStore:
    """Chunk-level operations over a backend, with a small thread pool doing hashing, zstd and I/O."""

    def __init__(
        self, backend: Backend, chunking: ChunkingSettings, io_threads: int, pack_bytes: int
    ) -> None:
        self._backend = backend
        self._chunking = chunking
        self._packs = PackIndex(backend)
        self._pack_bytes = pack_bytes
        self._codec = ChunkCodec(chunking.compression_level)
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="stasis-chunks")
        self._threads = io_threads

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=True)

    def _shared(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items on the pool's threads, results in input order.

        A thread takes the next item as it finishes one, so no thread waits on another's item
        and the caller hands nothing over per item; items are drawn (and so produced) only as
        threads come free. After each item a thread queues its next turn behind whatever else
        waits for the pool (a lazy restore's read-ahead, another put), so that a long put or
        fetch never holds the threads from it. The first failure stops the rest and is raised
        once every turn has ended, so no task still touches what the caller drops next."""
        source = enumerate(items)
        results: dict[int, R] = {}
        lock = threading.Lock()
        failed: list[BaseException] = []
        turns = self._threads
        ended = threading.Event()

        def stop(exc: BaseException | None) -> None:
            """End one turn for good (under the lock)."""
            nonlocal turns
            if exc is not None:
                failed.append(exc)
            turns -= 1
            if turns == 0:
                ended.set()

        def queue() -> None:
            try:
                self._pool.submit(turn)  # noqa: F821 (deleted once every turn has ended)
            except RuntimeError as exc:  # the pool is shut down
                with lock:
                    stop(exc)

        def turn() -> None:
            with lock:
                try:
                    taken = None if failed else next(source, None)
                except BaseException as exc:  # the producer failed
                    stop(exc)
                    return
                if taken is None:
                    stop(None)
                    return
            index, item = taken
            try:
                result = fn(item)
            except BaseException as exc:
                with lock:
                    stop(exc)
                return
            with lock:
                results[index] = result
            queue()  # noqa: F821 (as above)

        for _ in range(self._threads):
            queue()
        try:
            ended.wait()
        except BaseException as exc:  # interrupted: stop the threads before the caller cleans up
            with lock:
                failed.append(exc)
            ended.wait()
            raise
        finally:
            # Every turn has ended. `turn` and `queue` refer to each other: a cycle that would
            # hold fn, the items and the results until the next cyclic collection.
            del turn, queue
        if failed:
            raise failed[0]
        return [results[index] for index in range(len(results))]

    def read_later(self, refs: Sequence[ChunkRef]) -> Future[list[bytes | ChunkMismatch]]:
        """`read_run(refs)` on the pool (read-ahead)."""
        return self._pool.submit(self.read_run, refs)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """Run fn over items on the chunk pool (for manifest reads and similar fan-outs)."""
        return self._shared(fn, items)

    # -- writing -----------------------------------------------------------------------------

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
                        if offset + length - batch[0][0] >= _BATCH_BYTES:
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
            digests = iter([d for batch in self._shared(upload, producer) for d in batch])
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

    # -- reading -----------------------------------------------------------------------------

    def read_chunk(self, ref: ChunkRef) -> bytes:
        """Fetch and verify one chunk (a delta chunk with its base); raises ChunkMismatch (kind
        missing-chunk when absent)."""
        try:
            if ref.pack:
                blob = self._backend.get_range(pack_key(ref.pack), ref.offset, ref.stored_length)
            else:
                blob = self._backend.get(chunk_key(ref.hash))
        except ObjectMissing:
            where = f"pack {ref.pack}" if ref.pack else "chunk object"
            raise ChunkMismatch("missing-chunk", f"{where} is missing from the store") from None
        if ref.pack and len(blob) != ref.stored_length:
            raise ChunkMismatch(
                "missing-chunk",
                f"pack {ref.pack} ends {ref.stored_length - len(blob)} bytes short of the chunk",
            )
        base = None if ref.base is None else self._read_base(ref.base)
        return self._codec.decode(blob, ref.hash, ref.length, packed=bool(ref.pack), base=base)

    def _read_base(self, base: ChunkRef) -> bytes:
        try:
            return self.read_chunk(base)
        except ChunkMismatch as exc:
            raise _of_base(base, exc) from None

    def read_run(self, refs: Sequence[ChunkRef]) -> list[bytes | ChunkMismatch]:
        """Read chunks that lie one after another in one pack with one request, and verify each
        (the bases of delta chunks among them with a request for each run of bases)."""
        first = refs[0]
        if len(refs) == 1 or not first.pack:
            return [self._read_or_mismatch(r) for r in refs]
        span = refs[-1].offset + refs[-1].stored_length - first.offset
        try:
            data = self._backend.get_range(pack_key(first.pack), first.offset, span)
        except ObjectMissing:
            return [ChunkMismatch("missing-chunk", f"pack {first.pack} is missing from the store")] * len(
                refs
            )
        wanted = sorted({r.base for r in refs if r.base is not None}, key=lambda b: (b.pack, b.offset))
        bases = {
            base: _of_base(base, raw) if isinstance(raw, ChunkMismatch) else raw
            for run in _adjacent(wanted)
            for base, raw in zip(run, self.read_run(run), strict=True)
        }
        out: list[bytes | ChunkMismatch] = []
        whole = memoryview(data)
        for ref in refs:
            at = ref.offset - first.offset
            blob = whole[at : at + ref.stored_length]
            if len(blob) != ref.stored_length:
                out.append(ChunkMismatch("missing-chunk", f"pack {ref.pack} ends short of the chunk"))
                continue
            base = None if ref.base is None else bases[ref.base]
            if isinstance(base, ChunkMismatch):
                out.append(base)
                continue
            try:
                out.append(self._codec.decode(blob, ref.hash, ref.length, packed=True, base=base))
            except ChunkMismatch as exc:
                out.append(exc)
        return out

    def _read_or_mismatch(self, ref: ChunkRef) -> bytes | ChunkMismatch:
        try:
            return self.read_chunk(ref)
        except ChunkMismatch as exc:
            return exc

    def restore_files(self, snapshot_id: str, targets: Sequence[tuple[Entry, Path]]) -> None:
        """Write each entry's content into its (already created, sized) target file, verifying every
        chunk before it is written. Each thread takes the next few megabytes at a time: a part of a
        large file, or many small files together. Its chunks are read in the order they lie in their
        packs, a megabyte at a time, in one request where they lie together (a snapshot's small
        files mostly do), and a chunk the files hold in more than one place is read once."""
        repeats = _Repeats(ref for entry, _path in targets for ref in entry.chunks)

        def work() -> Iterator[list[_Piece]]:
            item: list[_Piece] = []
            size = 0
            for entry, path in targets:
                start = end = 0
                runs: list[list[ChunkRef]] = []
                for run in _adjacent(entry.chunks):
                    runs.append(run)
                    length = sum(ref.length for ref in run)
                    end += length
                    size += length
                    if size >= _ITEM_BYTES:
                        yield [*item, _Piece(entry, path, start, runs)]
                        item, size, start, runs = [], 0, end, []
                if runs:
                    item.append(_Piece(entry, path, start, runs))
            if item:
                yield item

        def read(refs: list[ChunkRef]) -> list[bytes | ChunkMismatch]:
            """Each of refs, read in the order they lie in their packs: small files' chunks lie
            together, but in the order the put's threads stored them."""
            order = sorted(range(len(refs)), key=lambda i: (refs[i].pack, refs[i].offset))
            raws: list[bytes | ChunkMismatch] = [b""] * len(refs)
            places = iter(order)
            for part in _adjacent([refs[i] for i in order]):
                for raw in repeats.read(part, self.read_run):
                    raws[next(places)] = raw
            return raws

        def restore(item: list[_Piece]) -> None:
            raws = iter(read([ref for piece in item for run in piece.runs for ref in run]))
            for piece in item:
                fd = os.open(piece.path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    offset = piece.offset
                    for run in piece.runs:
                        chunks = [verified(snapshot_id, piece.entry.path, ref, next(raws)) for ref in run]
                        _pwrite_all(fd, chunks, offset)
                        offset += sum(ref.length for ref in run)
                finally:
                    os.close(fd)

        self._shared(restore, work())

    def check(self, refs: Iterable[ChunkRef]) -> dict[ChunkRef, ChunkMismatch | None]:
        """Read and verify each distinct chunk (a copy in another pack is another chunk); None
        marks a good one."""
        distinct = list(dict.fromkeys(refs))

        def probe(ref: ChunkRef) -> ChunkMismatch | None:
            try:
                self.read_chunk(ref)
            except ChunkMismatch as exc:
                return exc
            return None

        return dict(zip(distinct, self._shared(probe, distinct), strict=True))


def verified(snapshot_id: str, path: str, ref: ChunkRef, raw: bytes | ChunkMismatch) -> bytes:
    """A chunk as read, or the restore's failure, naming the snapshot, file and chunk."""
    if isinstance(raw, ChunkMismatch):
        raise SnapshotCorrupt(snapshot_id, path, ref.hash, f"{raw.kind}: {raw.detail}")
    return raw


def _pwrite_all(fd: int, pieces: Sequence[bytes], offset: int) -> None:
    """Write pieces one after another at offset, with as few calls as the kernel allows."""
    views = [memoryview(p) for p in pieces]
    while views:
        written = os.pwritev(fd, views, offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _ref(digest: str, length: int, at: Located) -> ChunkRef:
    return ChunkRef(digest, length, at.stored_length, at.pack, at.offset, at.base)


def follows(prev: ChunkRef, ref: ChunkRef) -> bool:
    """Whether `ref` lies right after `prev` in the same pack, so that one request reads both."""
    return bool(ref.pack) and ref.pack == prev.pack and ref.offset == prev.offset + prev.stored_length


def _adjacent(refs: Iterable[ChunkRef]) -> Iterator[list[ChunkRef]]:
    """Refs in runs that lie one after another in one pack, each run at most about a megabyte of
    raw bytes, so that each is one request."""
    run: list[ChunkRef] = []
    size = 0
    for ref in refs:
        if run and (not follows(run[-1], ref) or size >= _BATCH_BYTES):
            yield run
            run, size = [], 0
        run.append(ref)
        size += ref.length
    if run:
        yield run


def _of_base(base: ChunkRef, failed: ChunkMismatch) -> ChunkMismatch:
    """What a delta chunk whose base could not be read fails with: the base's failure, named."""
    return ChunkMismatch(failed.kind, f"its base {base.hash}: {failed.detail}")
