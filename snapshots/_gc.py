"""Retention and mark-and-sweep garbage collection; runs only under the exclusive store lock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from ._backends import Backend, ObjectMissing
from ._chunking import CHUNK_PREFIX, digest_of_key
from ._chunkstore import ChunkStore
from ._errors import InvalidSettings, SnapshotCorrupt
from ._layout import (
    EPISODE_PREFIX,
    MANIFEST_PREFIX,
    PACK_PREFIX,
    episode_key,
    manifest_id,
    manifest_key,
    pack_index_key,
    split_episode_key,
    split_pack_key,
)
from ._locks import StoreLock, remove_stale
from ._manifest import Manifest
from ._packs import decode_index
from ._settings import LockSettings

_SWEEP_BATCH = 1000


@dataclass(frozen=True)
class RetentionPolicy:
    """Which snapshots GC keeps."""

    keep_last: int = 3
    """Snapshots kept per live episode, by highest seq. At least 1: the newest snapshot
    is what a preempted episode resumes from. 3 leaves room to fall back past a snapshot
    that fails to restore."""

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise InvalidSettings("keep_last", "must be at least 1; the newest snapshot is the resume point")


@dataclass(frozen=True)
class GcReport:
    """What a GC run removed and kept."""

    deleted_snapshots: tuple[str, ...]
    kept_snapshots: int
    live_chunks: int
    deleted_chunks: int
    freed_bytes: int
    removed_markers: int
    removed_locks: int
    removed_partial_files: int
    swept: bool
    """False when the sweep was skipped because some manifest could not be read
    (its chunks cannot be told apart from garbage); see unreadable."""
    unreadable: tuple[str, ...]


def run(
    backend: Backend,
    chunks: ChunkStore,
    locks: LockSettings,
    lock: StoreLock,
    retention: RetentionPolicy,
    ended: frozenset[str],
    load: Callable[[str], Manifest | None],
) -> GcReport:
    """Retention first (manifests, then markers), then mark from all manifests, then sweep."""
    removed_locks = remove_stale(backend, locks)

    by_episode: dict[str, list[str]] = defaultdict(list)
    for key in backend.list(EPISODE_PREFIX):
        if (marker := split_episode_key(key)) is not None:
            by_episode[marker[0]].append(marker[1])
    marked = [(episode, sid) for episode, sids in by_episode.items() for sid in sids]

    def load_quietly(snapshot_id: str) -> Manifest | None:
        try:
            return load(snapshot_id)
        except SnapshotCorrupt:
            return None

    loaded = chunks.map(load_quietly, [sid for _e, sid in marked])
    doomed: list[tuple[str, str]] = []
    dangling: list[tuple[str, str]] = []
    live_by_episode: dict[str, list[Manifest]] = defaultdict(list)
    for (episode, sid), manifest in zip(marked, loaded, strict=True):
        if manifest is None:
            # No manifest (or an unreadable one, which verify reports): only the marker goes here.
            # No writer is active under the exclusive lock, so a marker without a manifest is debris.
            if backend.size(manifest_key(sid)) is None:
                dangling.append((episode, sid))
        elif episode in ended:
            doomed.append((episode, sid))
        else:
            live_by_episode[episode].append(manifest)
    for manifests in live_by_episode.values():
        manifests.sort(key=lambda m: (m.seq, m.created_at, m.snapshot_id))
        doomed.extend((m.episode_id, m.snapshot_id) for m in manifests[: -retention.keep_last])

    # Manifests before markers: a snapshot stops existing at the first delete.
    backend.delete(manifest_key(sid) for _e, sid in doomed)
    backend.delete(episode_key(e, sid) for e, sid in doomed + dangling)

    # Mark from every manifest, listed now, not only those reached through markers.
    manifest_ids = [found for key in backend.list(MANIFEST_PREFIX) if (found := manifest_id(key))]
    live: set[str] = set()
    live_packs: set[str] = set()
    live_objects: set[str] = set()
    unreadable: list[str] = []
    kept = 0
    for sid, manifest in zip(manifest_ids, chunks.map(load_quietly, manifest_ids), strict=True):
        if manifest is None:
            if backend.size(manifest_key(sid)) is not None:
                unreadable.append(sid)
            continue
        kept += 1
        for entry in manifest.files():
            for ref in entry.chunks:
                live.add(ref.hash)
                if ref.pack:
                    live_packs.add(ref.pack)
                else:
                    live_objects.add(ref.hash)
                if ref.base is not None:  # a delta chunk decodes only with its base
                    live.add(ref.base.hash)
                    live_packs.add(ref.base.pack)

    deleted = 0
    freed = 0
    swept = not unreadable
    if swept:
        # A pack goes once no snapshot refers to any chunk in it; its index goes first, so no
        # later put can pick a chunk of it for reuse.
        dead_packs: dict[str, list[str]] = defaultdict(list)
        for key in backend.list(PACK_PREFIX):
            if (parsed := split_pack_key(key)) is not None and parsed[0] not in live_packs:
                dead_packs[parsed[0]].append(key)
        garbage = [
            key
            for key in backend.list(CHUNK_PREFIX)
            if (d := digest_of_key(key)) is not None and d not in live_objects
        ] + [
            key for keys in dead_packs.values() for key in sorted(keys, key=lambda k: not k.endswith(".idx"))
        ]
        deleted = len(garbage) - sum(len(keys) for keys in dead_packs.values())
        deleted += sum(chunks.map(_chunks_in, [(backend, pack) for pack in dead_packs]))
        for start in range(0, len(garbage), _SWEEP_BATCH):
            batch = garbage[start : start + _SWEEP_BATCH]
            freed += sum(
                size or 0
                for key, size in zip(batch, chunks.map(backend.size, batch), strict=True)
                if not key.endswith(".idx")
            )
            # Re-checked before every batch: if our lock went stale a writer may be live again.
            lock.ensure_held()
            backend.delete(batch)
    partial = backend.discard_partial(locks.stale_after_s)
    return GcReport(
        deleted_snapshots=tuple(sorted(sid for _e, sid in doomed)),
        kept_snapshots=kept,
        live_chunks=len(live),
        deleted_chunks=deleted,
        freed_bytes=freed,
        removed_markers=len(dangling),
        removed_locks=removed_locks,
        removed_partial_files=partial,
        swept=swept,
        unreadable=tuple(sorted(unreadable)),
    )


def _chunks_in(item: tuple[Backend, str]) -> int:
    """How many chunks a pack holds, by its index (0 if that is gone or unreadable)."""
    backend, pack_id = item
    try:
        return len(decode_index(pack_id, backend.get(pack_index_key(pack_id))))
    except (ObjectMissing, ValueError, TypeError, KeyError):
        return 0
