"""Packs: stored chunks written one after another into a few large objects, and the index of
where each chunk lies.

One object per 64 KiB chunk costs a file (or a PUT) per chunk; a pack costs one per few hundred
megabytes. Manifests record each chunk's pack and offset, so reads need no index. The indexes
serve deduplication: before a put, the store learns every pack's chunks (once per pack, then
only the packs that are new), and a chunk any pack already holds is not stored again. A delta
chunk is reused only while some known pack holds its base.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, replace

from ._backends import Backend, ObjectMissing, ObjectWriter
from ._layout import PACK_PREFIX, pack_index_key, pack_key, split_pack_key
from ._manifest import MAX_STORED_CHUNK, OFFSET_END, PACK_ID, ChunkRef
from ._settings import MAX_CHUNK

log = logging.getLogger(__name__)

INDEX_FORMAT = "stasis.pack-index/v1"


@dataclass(frozen=True)
class Located:
    """Where a stored chunk lies: its pack, offset and stored (compressed) length, and the base
    of a delta chunk."""

    pack: str
    offset: int
    stored_length: int
    base: ChunkRef | None = None


def encode_index(pack_id: str, chunks: dict[str, tuple[int, Located]]) -> bytes:
    """A pack's index: [hash, raw length, offset, stored length] of each chunk in it; a delta
    chunk's row, among "deltas", adds its base's hash and raw length."""
    rows = [
        [digest, length, at.offset, at.stored_length]
        for digest, (length, at) in chunks.items()
        if not at.base
    ]
    deltas = [
        [digest, length, at.offset, at.stored_length, at.base.hash, at.base.length]
        for digest, (length, at) in chunks.items()
        if at.base
    ]
    return json.dumps(
        {"format": INDEX_FORMAT, "pack": pack_id, "chunks": rows, "deltas": deltas}, separators=(",", ":")
    ).encode()


def decode_index(pack_id: str, raw: bytes) -> dict[str, Located]:
    """The chunks of a pack by hash; ValueError if the index is not one this store wrote. A delta
    chunk's base has only its hash and length: where it lies is wherever the store holds it."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError(f"the index of pack {pack_id} nests too deep") from None
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT or doc.get("pack") != pack_id:
        raise ValueError(f"not the index of pack {pack_id}")
    found: dict[str, Located] = {}
    for row in doc["chunks"] + doc.get("deltas", []):
        digest, _length, offset, stored, *base = row
        if not (
            _is_hash(digest)
            and type(offset) is int
            and type(stored) is int
            and 0 <= offset < OFFSET_END
            and 0 < stored <= MAX_STORED_CHUNK
        ):
            raise ValueError(f"bad row for {digest!r}")
        if base and not (
            len(base) == 2 and _is_hash(base[0]) and type(base[1]) is int and 0 < base[1] <= MAX_CHUNK
        ):
            raise ValueError(f"bad base for {digest!r}")
        found[digest] = Located(pack_id, offset, stored, ChunkRef(base[0], base[1], 0) if base else None)
    return found


def _is_hash(value: object) -> bool:
    return type(value) is str and len(value) == 64


class PackIndex:
    """What this process knows of the store's packs; refreshed under the store lock before a put,
    so that no pack a GC removed is ever referred to again."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._packs: dict[str, dict[str, Located]] = {}
        self._by_hash: dict[str, Located] = {}

    def refresh(self) -> None:
        """Learn the packs written since the last refresh, and forget those that are gone."""
        listed = {
            found[0]
            for key in self._backend.list(PACK_PREFIX)
            if (found := split_pack_key(key)) and found[1] == "idx"
        }
        with self._lock:
            known = set(self._packs)
        learned: dict[str, dict[str, Located]] = {}
        for pack_id in listed - known:
            try:
                chunks = decode_index(pack_id, self._backend.get(pack_index_key(pack_id)))
                size = self._backend.size(pack_key(pack_id))
                if size is None:
                    continue  # removed since it was listed
                # Another writer's index is trusted for deduplication only as far as it can be
                # checked cheaply: every chunk it names must lie inside its pack.
                beyond = next((d for d, at in chunks.items() if at.offset + at.stored_length > size), None)
                if beyond is not None:
                    raise ValueError(f"chunk {beyond} lies past the end of the pack ({size} bytes)")
                learned[pack_id] = chunks
            except ObjectMissing:
                continue  # removed since it was listed
            except (ValueError, TypeError, KeyError) as exc:
                # Its chunks are read through manifests all the same; they just do not deduplicate.
                log.warning("pack index %s is unreadable (%s); its chunks are not reused", pack_id, exc)
                learned[pack_id] = {}
        with self._lock:
            for pack_id in known - listed:
                self._packs.pop(pack_id, None)
            self._packs.update(learned)
            if known - listed or learned:
                self._by_hash = {d: at for chunks in self._packs.values() for d, at in chunks.items()}

    def find(self, digest: str) -> Located | None:
        """Where a chunk lies; for a delta chunk, with where its base lies now (None if no known
        pack holds the base plainly)."""
        with self._lock:
            at = self._by_hash.get(digest)
            if at is None or at.base is None:
                return at
            base = self._by_hash.get(at.base.hash)
        if base is None or base.base is not None:
            return None
        return replace(
            at, base=ChunkRef(at.base.hash, at.base.length, base.stored_length, base.pack, base.offset)
        )

    def learn(self, pack_id: str, chunks: dict[str, Located]) -> None:
        """A pack this process has just written and committed."""
        with self._lock:
            self._packs[pack_id] = chunks
            self._by_hash.update(chunks)


class PackWriter:
    """Appends stored chunks to packs of about `target_bytes`; each pack is committed, then its
    index. Safe to call from many threads: appends are serialised, compression is not."""

    def __init__(self, backend: Backend, index: PackIndex, target_bytes: int) -> None:
        self._backend = backend
        self._index = index
        self._target = target_bytes
        self._lock = threading.Lock()
        self._pack_id = ""
        self._writer: ObjectWriter | None = None
        self._written = 0
        self._chunks: dict[str, tuple[int, Located]] = {}
        self.committed: list[str] = []

    def append(self, digest: str, length: int, blob: bytes, base: ChunkRef | None = None) -> Located:
        with self._lock:
            if self._writer is None:
                self._pack_id = uuid.uuid4().hex
                assert PACK_ID.fullmatch(self._pack_id)
                self._writer = self._backend.writer(pack_key(self._pack_id))
                self._written, self._chunks = 0, {}
            self._writer.write(blob)
            at = Located(self._pack_id, self._written, len(blob), base)
            self._written += len(blob)
            self._chunks[digest] = (length, at)
            if self._written >= self._target:
                self._commit()
            return at

    def finish(self) -> None:
        """Commit the pack being written, if any."""
        with self._lock:
            self._commit()

    def abort(self) -> None:
        """Drop the pack being written. Committed ones stay until GC finds nothing refers to them."""
        with self._lock:
            if self._writer is not None:
                self._writer.abort()
                self._writer = None

    def _commit(self) -> None:
        if self._writer is None:
            return
        self._writer.commit()
        self._writer = None
        index = self._backend.writer(pack_index_key(self._pack_id))
        index.write(encode_index(self._pack_id, self._chunks))
        index.commit()
        self._index.learn(self._pack_id, {d: at for d, (_n, at) in self._chunks.items()})
        self.committed.append(self._pack_id)
