"""Delta chunks: a changed chunk stored against the parent snapshot's chunk that held its bytes.

A sandbox that runs on between two snapshots changes a page here and a page there. Content-defined
chunks deduplicate what did not change, but a 64 KiB chunk with one changed page is stored whole
again, and in an interpreter's heap the changed pages lie scattered: a tenth of them changed can
mean a fifth of the chunks. So a put that has a parent finds, for each chunk it must store, the
parent's chunk that held the same bytes before, and compresses the new chunk against it (zstd with
the base's raw bytes as its dictionary). What the two share then costs a few bytes; what changed
costs what it would anyway. The delta is kept only if it is at most half the chunk's plain stored
form, since reading it means reading its base too.

Where "the same bytes" sat is the caller's knowledge: a memory image's pages move between dumps
when mappings come and go, and only the pagemaps say where (`Segment`s, from the sandbox agent).
A file without them is taken to sit where it sat. A base is always a plain chunk: a delta's base
is the base of the parent's chunk if that one was itself a delta, so no read chains.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ._manifest import ChunkRef, Entry, chunk_lengths

DELTA_AT_MOST = 0.5
"""A delta is stored only if it is at most this share of the chunk's plain stored form."""
SAMPLES = 16
DELTA_FILE_BYTES = 1 << 20
"""Files smaller than this are stored without deltas: the small CRIU images and the checkpoint's
metadata, which a restore reads first, whole, before the sandbox runs. A delta would save them a
few kilobytes and cost that read a second one per chunk (about 1 ms of a 64 MiB restore's 17 ms
fetch, measured)."""


class Segment(NamedTuple):
    """`length` bytes at `offset` of a new file that sat at `parent_offset` of the parent's file."""

    offset: int
    parent_offset: int
    length: int


class Alignment(NamedTuple):
    """Where a new file's bytes sat in the parent snapshot: in its file `parent_path`, by segment
    (in order of offset). Bytes in no segment were not in the parent."""

    parent_path: str
    segments: Sequence[Segment]


Aligner = Callable[[Path, Callable[[str], bytes | None]], Mapping[str, Alignment]]
"""Given a checkpoint directory about to be stored, and a reader of the parent snapshot's files by
path (None for a file it does not have), the alignment of each file that did not stay in place."""


class Base(NamedTuple):
    """A new chunk's base, and where in it the chunk's first byte sat, if known."""

    ref: ChunkRef
    shift: int | None


def worth_a_delta(piece: memoryview, base: bytes, shift: int | None) -> bool:
    """Whether a chunk still holds enough of its base's bytes where they sat to try a delta,
    by SAMPLES samples of 8 bytes: a chunk that changed whole would only cost a compression
    against the base (zstd on random bytes with a dictionary: about 270 MB/s here, where it
    passes them over plainly at 5 GB/s)."""
    if shift is None:
        return True
    step = max(len(piece) // SAMPLES, 8)
    same = sum(
        piece[k : k + 8] == base[k + shift : k + shift + 8]
        for k in range(0, len(piece) - 8, step)
        if 0 <= k + shift <= len(base) - 8
    )
    return same >= 2


class ParentFile:
    """The parent's copy of one file being stored, to find each new chunk's base in."""

    def __init__(self, entry: Entry, segments: Sequence[Segment] | None) -> None:
        self._chunks = entry.chunks
        self._size = entry.size
        self._starts = [0, *itertools.accumulate(chunk_lengths(entry.chunks))][:-1]
        self._segments = sorted(segments, key=lambda s: s.offset) if segments is not None else None
        self._segment_starts = [s.offset for s in self._segments or ()]

    def base_for(self, offset: int, length: int) -> Base | None:
        """The plain chunk of the parent that held the middle of [offset, offset + length)."""
        middle = offset + length // 2
        at = self._parent_offset(middle)
        if at is None or not 0 <= at < self._size:
            return None
        i = bisect.bisect_right(self._starts, at) - 1
        ref = self._chunks[i]
        if ref.base is not None:  # its own base held these bytes somewhere: where, it cannot tell
            return Base(ref.base, None) if ref.base.pack else None
        # A chunk of format v1 has no pack to name.
        return Base(ref, at - self._starts[i] - (middle - offset)) if ref.pack else None

    def _parent_offset(self, offset: int) -> int | None:
        if self._segments is None:
            return offset
        i = bisect.bisect_right(self._segment_starts, offset) - 1
        if i < 0:
            return None
        segment = self._segments[i]
        if offset >= segment.offset + segment.length:
            return None
        return segment.parent_offset + offset - segment.offset
