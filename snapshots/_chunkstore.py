"""The content-addressed chunk space over one backend: chunks read and verified (a run of them
that lies together in a pack with one request), files restored from them, and puts handed to
`_uploads`, all on one set of chunk threads (`_workers`)."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ._backends import Backend, ObjectMissing
from ._chunking import ChunkCodec, ChunkMismatch, chunk_key
from ._deltas import ParentFile
from ._errors import SnapshotCorrupt
from ._layout import pack_key
from ._manifest import ChunkRef, Entry
from ._settings import ChunkingSettings
from ._uploads import Uploader, UploadTally
from ._workers import BATCH_BYTES, ChunkThreads

T = TypeVar("T")
R = TypeVar("R")

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
        self._codec = ChunkCodec(chunking.compression_level)
        self._threads = ChunkThreads(io_threads)
        self._uploader = Uploader(backend, chunking, pack_bytes, self._codec, self._threads, self._read_base)

    def close(self) -> None:
        """Stop the worker threads."""
        self._threads.close()

    def read_later(self, refs: Sequence[ChunkRef]) -> Future[list[bytes | ChunkMismatch]]:
        """`read_run(refs)` on the pool (read-ahead)."""
        return self._threads.submit(self.read_run, refs)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """Run fn over items on the chunk pool (for manifest reads and similar fan-outs)."""
        return self._threads.shared(fn, items)

    def store_files(
        self, files: Sequence[tuple[Path, int, ParentFile | None]], parent: Iterable[ChunkRef] = ()
    ) -> tuple[list[tuple[ChunkRef, ...]], UploadTally]:
        """Chunk, deduplicate and pack each (path, size, the parent's copy), as `Uploader.store_files`."""
        return self._uploader.store_files(files, parent)

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

        self._threads.shared(restore, work())

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

        return dict(zip(distinct, self._threads.shared(probe, distinct), strict=True))


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


def follows(prev: ChunkRef, ref: ChunkRef) -> bool:
    """Whether `ref` lies right after `prev` in the same pack, so that one request reads both."""
    return bool(ref.pack) and ref.pack == prev.pack and ref.offset == prev.offset + prev.stored_length


def _adjacent(refs: Iterable[ChunkRef]) -> Iterator[list[ChunkRef]]:
    """Refs in runs that lie one after another in one pack, each run at most about a megabyte of
    raw bytes, so that each is one request."""
    run: list[ChunkRef] = []
    size = 0
    for ref in refs:
        if run and (not follows(run[-1], ref) or size >= BATCH_BYTES):
            yield run
            run, size = [], 0
        run.append(ref)
        size += ref.length
    if run:
        yield run


def _of_base(base: ChunkRef, failed: ChunkMismatch) -> ChunkMismatch:
    """What a delta chunk whose base could not be read fails with: the base's failure, named."""
    return ChunkMismatch(failed.kind, f"its base {base.hash}: {failed.detail}")
