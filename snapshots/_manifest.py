"""The versioned snapshot manifest's records: what callers describe (`SnapshotMeta`, checked by
`validate_meta`), what the store records (`Manifest`, its entries and their chunks), and the bounds
a chunk reference keeps to. Their stored JSON form is `_manifest_json`'s."""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from typing import Any, NamedTuple, overload

from ._errors import InvalidSnapshotMeta
from ._settings import MAX_CHUNK

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
# OCI image-spec digest grammar; sha256 is the only algorithm images use in practice.
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[A-Za-z0-9=_-]+")
_SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_BACKEND = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_CRIU_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*(?:[-+~][A-Za-z0-9.+~-]+)?")
PACK_ID = re.compile(r"[0-9a-f]{32}")
MAX_STORED_CHUNK = MAX_CHUNK + (MAX_CHUNK >> 7) + 4096
"""The largest stored form of a chunk: one zstd frame of MAX_CHUNK, which zstd bounds at its
content plus 1/256 and a header (this allows 1/128 and 4 KiB)."""
OFFSET_END = 1 << 63
"""Offsets in packs lie below this (a file offset is a signed 64-bit number)."""


class Reason(enum.StrEnum):
    """Why a snapshot was taken."""

    MANUAL = "manual"
    TIME_SLICE = "time-slice"
    PRIORITY = "priority"
    DRAIN = "drain"
    AUTOSAVE = "autosave"
    FORK = "fork"


class EntryKind(enum.StrEnum):
    """Kinds of tree entries a snapshot can hold."""

    DIR = "dir"
    FILE = "file"
    SYMLINK = "symlink"


@dataclass(frozen=True)
class SnapshotMeta:
    """What the caller tells the store about a snapshot it is about to put."""

    snapshot_id: str
    episode_id: str
    seq: int
    node: str
    reason: Reason | str
    created_at: datetime
    image_digest: str
    runtime_backend: str
    criu_version: str
    parent_id: str | None = None
    trajectory_cursor: Any = None
    """Opaque JSON value (the ledger position this snapshot matches); stored verbatim."""
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    """Caller-side phase timings in milliseconds (freeze, dump, ...)."""


class ChunkRef(NamedTuple):
    """One chunk of a file: the hash of its raw bytes, raw length and stored (compressed) length,
    and where it lies: at `offset` in pack `pack` (hash BLAKE3), or, in snapshots of format v1, in
    an object of its own (hash SHA-256).

    A delta chunk has a `base`: another chunk, in a pack and with no base of its own, whose raw
    bytes its zstd frame was compressed against (a raw-content dictionary): the parent snapshot's
    chunk that held the same bytes before a few of them changed (`_deltas`)."""

    hash: str
    length: int
    stored_length: int
    pack: str = ""
    offset: int = 0
    base: ChunkRef | None = None


class ChunkTable(Sequence[ChunkRef]):
    """A file's chunks as a v3 manifest stores them, in columns, with each `ChunkRef` made only
    when it is asked for. A 2 GiB memory image has 32,768 chunks; a lazy restore reads a few of
    them before the sandbox runs, so making them all first would only delay it."""

    __slots__ = ("_base_of", "_hashes", "_offsets", "_packs", "_stored", "_where", "bases", "lengths")

    def __init__(
        self,
        hashes: str,
        lengths: list[int],
        stored: list[int],
        packs: list[str],
        where: list[int],
        offsets: list[int],
        bases: Sequence[ChunkRef] = (),
        base_of: list[int] | None = None,
    ) -> None:
        self._hashes = hashes
        self.lengths = lengths
        """Each chunk's raw length, in order."""
        self._stored = stored
        self._packs = packs
        self._where = where
        self._offsets = offsets
        self.bases = bases
        """The distinct bases of this file's delta chunks."""
        self._base_of = base_of
        """Each chunk's base as an index into `bases`, or -1 for none; None when no chunk has one."""

    def _base(self, i: int) -> ChunkRef | None:
        if self._base_of is None or self._base_of[i] < 0:
            return None
        return self.bases[self._base_of[i]]

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, index: int) -> ChunkRef: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[ChunkRef, ...]: ...
    def __getitem__(self, index: int | slice) -> ChunkRef | tuple[ChunkRef, ...]:
        if isinstance(index, slice):
            return tuple(map(self.__getitem__, range(len(self))[index]))
        i = range(len(self))[index]
        return ChunkRef(
            self._hashes[64 * i : 64 * i + 64],
            self.lengths[i],
            self._stored[i],
            self._packs[self._where[i]],
            self._offsets[i],
            self._base(i),
        )

    def __iter__(self) -> Iterator[ChunkRef]:
        digests = (self._hashes[i : i + 64] for i in range(0, len(self._hashes), 64))
        named = map(self._packs.__getitem__, self._where)
        bases = repeat(None, len(self)) if self._base_of is None else map(self._base, range(len(self)))
        # tuple.__new__ as NamedTuple._make does, without its per-call length check: 3x faster.
        return map(
            tuple.__new__,
            repeat(ChunkRef),
            zip(digests, self.lengths, self._stored, named, self._offsets, bases, strict=True),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple | ChunkTable):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))


def chunk_lengths(chunks: Sequence[ChunkRef]) -> Iterable[int]:
    """Each chunk's raw length, in order, without making the chunks of a `ChunkTable`."""
    return chunks.lengths if isinstance(chunks, ChunkTable) else (c.length for c in chunks)


@dataclass(frozen=True)
class Entry:
    """One path of the stored tree, relative to the checkpoint directory, '/'-separated."""

    path: str
    kind: EntryKind
    mode: int
    """Permission bits (st_mode & 0o7777)."""
    size: int = 0
    chunks: Sequence[ChunkRef] = ()
    """A tuple, or a `ChunkTable` when read from a v3 manifest."""
    target: str | None = None
    """Link target, for symlinks only."""


@dataclass(frozen=True)
class SnapshotSizes:
    """Byte counts of one snapshot.

    logical: sum of file sizes. stored: compressed size of the distinct chunks
    the snapshot references. new: compressed bytes this snapshot's put uploaded
    (chunks no earlier snapshot had).
    """

    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    chunks: int
    unique_chunks: int
    new_chunks: int

    @property
    def dedup_ratio(self) -> float:
        """Logical over stored bytes (compression plus in-snapshot deduplication)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 1.0


@dataclass(frozen=True)
class Manifest:
    """A committed snapshot: metadata plus every entry of the tree with its chunks."""

    snapshot_id: str
    episode_id: str
    seq: int
    parent_id: str | None
    node: str
    reason: Reason
    created_at: datetime
    image_digest: str
    runtime_backend: str
    criu_version: str
    trajectory_cursor: Any
    timings_ms: Mapping[str, float]
    sizes: SnapshotSizes
    chunking: Mapping[str, Any]
    entries: tuple[Entry, ...]
    digest: str = field(default="", compare=False)
    """`manifest_digest` of the manifest's bytes as stored: what the orchestrator records of a
    snapshot, and what a restore is given to check them against before it parses them. Not
    compared: the same snapshot stored in an older format has other bytes."""

    def files(self) -> tuple[Entry, ...]:
        """Regular-file entries, in manifest order."""
        return tuple(e for e in self.entries if e.kind is EntryKind.FILE)


def manifest_digest(raw: bytes) -> str:
    """The digest of a manifest's stored bytes, "sha256:<64 hex>"."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def valid_id(value: object) -> bool:
    """Whether value is usable as a snapshot or episode id (also a safe object-key component)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def validate_meta(meta: SnapshotMeta) -> None:
    """Raise InvalidSnapshotMeta naming the first bad field."""
    for name in ("snapshot_id", "episode_id"):
        if not valid_id(getattr(meta, name)):
            raise InvalidSnapshotMeta(name, f"must match {_ID.pattern}")
    if meta.parent_id is not None:
        if not valid_id(meta.parent_id):
            raise InvalidSnapshotMeta("parent_id", f"must be None or match {_ID.pattern}")
        if meta.parent_id == meta.snapshot_id:
            raise InvalidSnapshotMeta("parent_id", "a snapshot cannot be its own parent")
    if isinstance(meta.seq, bool) or not isinstance(meta.seq, int) or meta.seq < 0:
        raise InvalidSnapshotMeta("seq", "must be a non-negative integer")
    if not isinstance(meta.node, str) or not _NODE.fullmatch(meta.node):
        raise InvalidSnapshotMeta("node", f"must match {_NODE.pattern}")
    try:
        Reason(meta.reason)
    except ValueError:
        raise InvalidSnapshotMeta("reason", f"must be one of {[r.value for r in Reason]}") from None
    if not isinstance(meta.created_at, datetime) or meta.created_at.utcoffset() is None:
        raise InvalidSnapshotMeta("created_at", "must be a timezone-aware datetime")
    digest = meta.image_digest
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidSnapshotMeta("image_digest", "must be an OCI digest such as sha256:<64 hex>")
    if digest.startswith("sha256:") and not _SHA256_DIGEST.fullmatch(digest):
        raise InvalidSnapshotMeta("image_digest", "a sha256 digest needs exactly 64 lowercase hex digits")
    if not isinstance(meta.runtime_backend, str) or not _BACKEND.fullmatch(meta.runtime_backend):
        raise InvalidSnapshotMeta("runtime_backend", f"must match {_BACKEND.pattern} (e.g. runc, docker)")
    if not isinstance(meta.criu_version, str) or not _CRIU_VERSION.fullmatch(meta.criu_version):
        raise InvalidSnapshotMeta("criu_version", "must be a dotted version such as 4.2.1")
    try:
        json.dumps(meta.trajectory_cursor, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSnapshotMeta("trajectory_cursor", f"must be JSON-serialisable: {exc}") from None
    if not isinstance(meta.timings_ms, Mapping):
        raise InvalidSnapshotMeta("timings_ms", "must be a mapping of phase name to milliseconds")
    for key, value in meta.timings_ms.items():
        if not isinstance(key, str) or not key:
            raise InvalidSnapshotMeta("timings_ms", f"phase name {key!r} must be a non-empty string")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InvalidSnapshotMeta("timings_ms", f"{key}: {value!r} is not a non-negative number of ms")
