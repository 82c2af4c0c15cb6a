"""The manifest's stored JSON form: `encode` writes the current format, `decode` reads every
format this store ever wrote and checks every field, so that a manifest that decodes can be
fetched without writing outside its destination or allocating more than its chunks need."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ._collector import collector_paused
from ._errors import SnapshotCorrupt
from ._manifest import (
    MAX_STORED_CHUNK,
    OFFSET_END,
    PACK_ID,
    ChunkRef,
    ChunkTable,
    Entry,
    EntryKind,
    Manifest,
    Reason,
    SnapshotSizes,
    chunk_lengths,
    manifest_digest,
    valid_id,
)
from ._settings import MAX_CHUNK

FORMAT = "stasis.snapshot/v3"
"""Written by this store for a snapshot without delta chunks. v3 lists a file's chunks as columns
(a 2 GiB memory image's 32,768 decode in a third of the time); v2 as one list per chunk, with where
it lies in a pack; v1 has one object per chunk. All are read."""
DELTA_FORMAT = "stasis.snapshot/v4"
"""Written for a snapshot with delta chunks: v3 plus the base of each (`ChunkRef.base`). A snapshot
without them stays v3, which earlier releases read."""
_LISTED = frozenset({"stasis.snapshot/v1", "stasis.snapshot/v2"})
"""The formats whose files list one `[hash, length, stored length(, pack, offset)]` per chunk."""
READABLE = _LISTED | {FORMAT, DELTA_FORMAT}

_CHUNK_HASH = re.compile(r"[0-9a-f]{64}")
_INT = frozenset({int})


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z suffix, the form Go's time.Time and our agents parse."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def encode(manifest: Manifest) -> bytes:
    """Serialise a manifest to its stored JSON form."""
    entries: list[dict[str, Any]] = []
    deltas = any(c.base is not None for e in manifest.entries for c in e.chunks)
    for e in manifest.entries:
        item: dict[str, Any] = {"path": e.path, "type": e.kind.value, "mode": e.mode}
        if e.kind is EntryKind.FILE:
            item["size"] = e.size
            item["chunks"] = _chunk_table(e.chunks)
        elif e.kind is EntryKind.SYMLINK:
            item["target"] = e.target
        entries.append(item)
    s = manifest.sizes
    doc = {
        "format": DELTA_FORMAT if deltas else FORMAT,
        "snapshot_id": manifest.snapshot_id,
        "episode_id": manifest.episode_id,
        "seq": manifest.seq,
        "parent_id": manifest.parent_id,
        "node": manifest.node,
        "reason": manifest.reason.value,
        "created_at": rfc3339(manifest.created_at),
        "image_digest": manifest.image_digest,
        "runtime_backend": manifest.runtime_backend,
        "criu_version": manifest.criu_version,
        "trajectory_cursor": manifest.trajectory_cursor,
        "timings_ms": dict(manifest.timings_ms),
        "sizes": {
            "logical_bytes": s.logical_bytes,
            "stored_bytes": s.stored_bytes,
            "new_bytes": s.new_bytes,
            "chunks": s.chunks,
            "unique_chunks": s.unique_chunks,
            "new_chunks": s.new_chunks,
        },
        "chunking": dict(manifest.chunking),
        "entries": entries,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _chunk_table(chunks: Sequence[ChunkRef]) -> dict[str, Any]:
    """A file's chunks as columns: the hashes one after another, and each chunk's pack as an index
    into the file's own list of packs ("" for a chunk stored as an object of its own, as v1 did).
    If any chunk is a delta, "base" gives each chunk's base as an index into "bases" (the same
    columns, over the distinct bases), or -1."""
    packs: dict[str, int] = {}
    table = _columns(chunks, packs)
    bases: dict[ChunkRef, int] = {}
    base_of = [-1 if c.base is None else bases.setdefault(c.base, len(bases)) for c in chunks]
    if bases:
        table["base"] = base_of
        table["bases"] = _columns(list(bases), packs)
    table["packs"] = list(packs)
    return table


def _columns(chunks: Sequence[ChunkRef], packs: dict[str, int]) -> dict[str, Any]:
    return {
        "hashes": "".join(c.hash for c in chunks),
        "lengths": [c.length for c in chunks],
        "stored_lengths": [c.stored_length for c in chunks],
        "pack": [packs.setdefault(c.pack, len(packs)) for c in chunks],
        "offsets": [c.offset for c in chunks],
    }


def _safe_path(path: object) -> bool:
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def decode(raw: bytes, snapshot_id: str) -> Manifest:
    """Parse and check a stored manifest; anything malformed is SnapshotCorrupt."""
    with collector_paused():
        return _decode(raw, snapshot_id)


def _decode(raw: bytes, snapshot_id: str) -> Manifest:

    def bad(detail: str) -> SnapshotCorrupt:
        return SnapshotCorrupt(snapshot_id, None, None, f"unreadable manifest: {detail}")

    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON ({exc})") from None
    except RecursionError:
        raise bad("nests too deep") from None
    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    if not isinstance(doc.get("format"), str) or doc["format"] not in READABLE:
        raise bad(f"format {doc.get('format')!r}, this reader understands {sorted(READABLE)}")
    try:
        if doc["snapshot_id"] != snapshot_id:
            raise bad(f"records snapshot id {doc['snapshot_id']!r}")
        listed = doc["format"] in _LISTED
        deltas = doc["format"] == DELTA_FORMAT
        chunking = doc["chunking"]
        largest = chunking.get("max_size", MAX_CHUNK) if type(chunking) is dict else MAX_CHUNK
        if type(largest) is not int or not 0 < largest <= MAX_CHUNK:
            raise bad(f"chunking max_size {largest!r} is not 1..{MAX_CHUNK}")
        entries = tuple(_decode_entry(item, listed, deltas, largest) for item in doc["entries"])
        _check_tree(entries)
        sizes = SnapshotSizes(**{k: int(v) for k, v in doc["sizes"].items()})
        created_at = datetime.fromisoformat(doc["created_at"])
        manifest = Manifest(
            snapshot_id=doc["snapshot_id"],
            episode_id=str(doc["episode_id"]),
            seq=int(doc["seq"]),
            parent_id=doc["parent_id"],
            node=str(doc["node"]),
            reason=Reason(doc["reason"]),
            created_at=created_at,
            image_digest=str(doc["image_digest"]),
            runtime_backend=str(doc["runtime_backend"]),
            criu_version=str(doc["criu_version"]),
            trajectory_cursor=doc["trajectory_cursor"],
            timings_ms={str(k): float(v) for k, v in doc["timings_ms"].items()},
            sizes=sizes,
            chunking=dict(doc["chunking"]),
            entries=entries,
            digest=manifest_digest(raw),
        )
    except SnapshotCorrupt:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise bad(f"{type(exc).__name__}: {exc}") from None
    if not valid_id(manifest.episode_id):
        raise bad("bad episode_id")
    return manifest


def _check_tree(entries: tuple[Entry, ...]) -> None:
    """Every parent is an earlier directory entry and no path repeats, so a fetch can never
    write through a symlink or outside its destination."""
    dirs: set[str] = set()
    seen: set[str] = set()
    for e in entries:
        parent = e.path.rpartition("/")[0]
        if parent and parent not in dirs:
            raise ValueError(f"{e.path}: parent is not an earlier directory entry")
        if e.path in seen:
            raise ValueError(f"{e.path}: listed twice")
        seen.add(e.path)
        if e.kind is EntryKind.DIR:
            dirs.add(e.path)


def _decode_entry(item: dict[str, Any], listed: bool, deltas: bool, largest: int) -> Entry:
    """One entry; its chunks at most `largest` bytes each (the chunking's max_size), so that a
    small manifest cannot have a reader allocate gigabytes per chunk. Only a v4 manifest (`deltas`)
    may give chunks bases."""
    path = item["path"]
    if not _safe_path(path):
        raise ValueError(f"unsafe entry path {path!r}")
    kind = EntryKind(item["type"])
    mode = int(item["mode"])
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"{path}: mode {mode:o} out of range")
    if kind is EntryKind.FILE:
        chunks: Sequence[ChunkRef]
        if listed:
            packs: set[str] = set()  # a file's chunks lie in a few packs: each id is checked once
            chunks = tuple(_decode_chunk(path, c, packs) for c in item["chunks"])
        else:
            chunks = _decode_table(path, item["chunks"], deltas)
        if chunks and max(chunk_lengths(chunks)) > largest:
            raise ValueError(f"{path}: a chunk is longer than the chunking's max_size {largest}")
        size = int(item["size"])
        if sum(chunk_lengths(chunks)) != size:
            raise ValueError(f"{path}: chunk lengths do not add up to size {size}")
        return Entry(path, kind, mode, size, chunks)
    if kind is EntryKind.SYMLINK:
        target = item["target"]
        if not isinstance(target, str) or not target:
            raise ValueError(f"{path}: symlink without target")
        return Entry(path, kind, mode, target=target)
    return Entry(path, kind, mode)


def _decode_table(path: str, table: Any, deltas: bool) -> ChunkTable:
    """The chunks of a `_chunk_table`, every column checked whole."""
    if type(table) is not dict:
        raise ValueError(f"{path}: chunks are not a table")
    packs = table["packs"]
    if type(packs) is not list or not all(type(p) is str and (not p or PACK_ID.fullmatch(p)) for p in packs):
        raise ValueError(f"{path}: bad pack list {packs!r}")
    hashes, lengths, stored, where, offsets = _decode_columns(path, table, packs)
    if "base" not in table and "bases" not in table:
        return ChunkTable(hashes, lengths, stored, packs, where, offsets)
    if not deltas:
        raise ValueError(f"{path}: chunks have bases, which only a {DELTA_FORMAT} manifest gives")
    base_of, columns = table["base"], table["bases"]
    if type(columns) is not dict:
        raise ValueError(f"{path}: bases are not a table")
    b_hashes, b_lengths, b_stored, b_where, b_offsets = _decode_columns(f"{path} (bases)", columns, packs)
    bases = [
        ChunkRef(b_hashes[64 * i : 64 * i + 64], b_lengths[i], b_stored[i], packs[b_where[i]], b_offsets[i])
        for i in range(len(b_lengths))
    ]
    # A base may come from a parent chunked with a larger max_size, never beyond any chunking's.
    if any(not b.pack or b.length > MAX_CHUNK for b in bases):
        raise ValueError(f"{path}: a base chunk lies in no pack or is longer than any chunk")
    if not (type(base_of) is list and set(map(type, base_of)) <= _INT and len(base_of) == len(lengths)):
        raise ValueError(f"{path}: the base column is not one integer per chunk")
    if base_of and not -1 <= min(base_of) <= max(base_of) < len(bases):
        raise ValueError(f"{path}: a chunk names base {max(base_of)} of {len(bases)}")
    return ChunkTable(hashes, lengths, stored, packs, where, offsets, bases, base_of)


def _decode_columns(
    path: str, table: dict[str, Any], packs: list[str]
) -> tuple[str, list[int], list[int], list[int], list[int]]:
    """The hash, length, stored length, pack and offset columns of a chunk table, checked whole."""
    hashes = table["hashes"]
    columns = [table[name] for name in ("lengths", "stored_lengths", "pack", "offsets")]
    if not all(type(column) is list and set(map(type, column)) <= _INT for column in columns):
        raise ValueError(f"{path}: a chunk column holds something other than integers")
    lengths, stored, where, offsets = columns
    n = len(lengths)
    if not (type(hashes) is str and len(hashes) == 64 * n and hashes.isascii() and _hex(hashes)):
        raise ValueError(f"{path}: chunk hashes are not {n} BLAKE3 digests in lowercase hex")
    if not len(stored) == len(where) == len(offsets) == n:
        raise ValueError(f"{path}: chunk columns differ in length")
    if n and (min(lengths) <= 0 or min(stored) <= 0 or min(offsets) < 0 or min(where) < 0):
        raise ValueError(f"{path}: a chunk length, offset or pack index is out of range")
    if n and (max(stored) > MAX_STORED_CHUNK or max(offsets) >= OFFSET_END):
        raise ValueError(f"{path}: a chunk's stored length or offset is out of range")
    if n and max(where) >= len(packs):
        raise ValueError(f"{path}: a chunk names pack {max(where)} of {len(packs)}")
    return hashes, lengths, stored, where, offsets


def _hex(text: str) -> bool:
    """Whether ASCII `text` is lowercase hex digits only."""
    return not text.encode().translate(None, b"0123456789abcdef")


def _decode_chunk(path: str, item: Any, packs: set[str]) -> ChunkRef:
    if type(item) is not list:
        raise ValueError(f"{path}: bad chunk reference {item!r}")
    if len(item) == 5:
        digest, length, stored_length, pack, offset = item
        if not (type(offset) is int and 0 <= offset < OFFSET_END):
            raise ValueError(f"{path}: bad chunk location {item!r}")
        if pack not in packs:
            if not (type(pack) is str and PACK_ID.fullmatch(pack)):
                raise ValueError(f"{path}: bad chunk location {item!r}")
            packs.add(pack)
    elif len(item) == 3:
        digest, length, stored_length = item
        pack, offset = "", 0
    else:
        raise ValueError(f"{path}: bad chunk reference {item!r}")
    if not (
        type(length) is int
        and type(stored_length) is int
        and length > 0
        and 0 < stored_length <= MAX_STORED_CHUNK
        and type(digest) is str
        and _CHUNK_HASH.fullmatch(digest)
    ):
        raise ValueError(f"{path}: bad chunk reference {item!r}")
    return ChunkRef(digest, length, stored_length, pack, offset)
