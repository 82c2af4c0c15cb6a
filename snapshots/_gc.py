"""Retention and mark-and-sweep garbage collection: retention and the mark under a shared store
lock, beside puts and restores; the sweep, which checks the mark again and deletes what no put
could find any more, under the exclusive one; the rest of the deleting under a shared lock again."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

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


@dataclass
class _Refs:
    """The chunks manifests refer to: by hash, and where they lie (packs, loose objects)."""

    hashes: set[str] = field(default_factory=set)
    packs: set[str] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)

    def add(self, manifest: Manifest) -> None:
        for entry in manifest.files():
            for ref in entry.chunks:
                self.hashes.add(ref.hash)
                if ref.pack:
                    self.packs.add(ref.pack)
                else:
                    self.objects.add(ref.hash)
                if ref.base is not None:  # a delta chunk decodes only with its base
                    self.hashes.add(ref.base.hash)
                    self.packs.add(ref.base.pack)


@dataclass
class Marked:
    """What GC's mark found under a shared lock, for its sweep to check under the exclusive one."""

    deleted_snapshots: tuple[str, ...]
    removed_locks: int
    readable: set[str]
    """Snapshots whose manifests were read (their chunks are in `refs`)."""
    unreadable: set[str]
    refs: _Refs
    loose: list[str]
    """Keys of loose chunk objects no manifest read refers to."""
    dead_packs: dict[str, list[str]]
    """Keys of each pack no manifest read refers to (its data, its index, or both)."""
    chunks_in: dict[str, int]
    """How many chunks each of `dead_packs` holds, by its index."""


@dataclass(frozen=True)
class Swept:
    """What GC's sweep decided under the exclusive lock, for `remove` to finish after it."""

    report: GcReport
    """The run's report, but for what `remove` frees."""
    pack_data: list[str]
    """Keys of the data of packs whose indexes the sweep deleted."""


def retained(
    manifests: list[Manifest], keep_last: int, resume_point: str, pending: Collection[str]
) -> set[str]:
    """What retention keeps of a live episode's snapshots (`manifests` in seq order): its newest
    `keep_last`; its resume point and the `keep_last - 1` before it, to fall back to should it
    fail to restore, however many newer snapshots the episode's record does not know (an
    autosave whose reply was lost, published after it was given up); and any snapshot still
    being taken."""
    ids = [m.snapshot_id for m in manifests]
    kept = set(ids[-keep_last:]) | (set(pending) & set(ids))
    if resume_point in ids:
        at = ids.index(resume_point)
        kept |= set(ids[max(0, at - keep_last + 1) : at + 1])
    return kept


def mark(
    backend: Backend,
    chunks: ChunkStore,
    locks: LockSettings,
    retention: RetentionPolicy,
    ended: frozenset[str],
    load: Callable[[str], Manifest | None],
    resume_points: Mapping[str, str] | None = None,
    pending: Collection[str] = (),
) -> Marked:
    """Retention (manifests, then markers), then mark from every manifest, then list what no
    manifest refers to. Under a shared lock: puts and restores go on meanwhile, so what was
    garbage here may be referred to by the time of the `sweep`, which checks again."""
    resume_points = resume_points or {}
    # What a live episode may still restore stays, whichever episode took it: a fork child's
    # resume point is its parent's snapshot, kept after the parent ended and past its keep_last.
    anchored = set(resume_points.values()) | set(pending)
    removed_locks = remove_stale(backend, locks)
    by_episode: dict[str, list[str]] = defaultdict(list)
    for key in backend.list(EPISODE_PREFIX):
        if (marker := split_episode_key(key)) is not None:
            by_episode[marker[0]].append(marker[1])
    marked = [(episode, sid) for episode, sids in by_episode.items() for sid in sids]
    doomed: list[tuple[str, str]] = []
    live_by_episode: dict[str, list[Manifest]] = defaultdict(list)
    loaded: dict[str, Manifest] = {}
    # A marker without a readable manifest may be a put's, still under way: the sweep decides.
    for (episode, sid), manifest in zip(
        marked, _load_all(chunks, load, [s for _e, s in marked]), strict=True
    ):
        if manifest is None:
            continue
        loaded[sid] = manifest
        if episode in ended:
            if sid not in anchored:
                doomed.append((episode, sid))
        else:
            live_by_episode[episode].append(manifest)
    for episode, manifests in live_by_episode.items():
        manifests.sort(key=lambda m: (m.seq, m.created_at, m.snapshot_id))
        kept = retained(manifests, retention.keep_last, resume_points.get(episode, ""), pending)
        doomed.extend(
            (m.episode_id, m.snapshot_id) for m in manifests if m.snapshot_id not in kept | anchored
        )
    # Manifests before markers: a snapshot stops existing at the first delete.
    backend.delete(manifest_key(sid) for _e, sid in doomed)
    backend.delete(episode_key(e, sid) for e, sid in doomed)

    # Mark from every manifest, listed now, not only those reached through markers; those the
    # retention read are not read again (a manifest never changes).
    refs = _Refs()
    readable, unreadable = _read(backend, chunks, load, _manifest_ids(backend), refs, loaded)
    # A pack goes once no snapshot refers to any chunk in it: its index in the sweep, after
    # which no put can pick a chunk of it for reuse, its data after that.
    dead_packs: dict[str, list[str]] = defaultdict(list)
    for key in backend.list(PACK_PREFIX):
        if (parsed := split_pack_key(key)) is not None and parsed[0] not in refs.packs:
            dead_packs[parsed[0]].append(key)
    loose = [
        key
        for key in backend.list(CHUNK_PREFIX)
        if (d := digest_of_key(key)) is not None and d not in refs.objects
    ]
    return Marked(
        deleted_snapshots=tuple(sorted(sid for _e, sid in doomed)),
        removed_locks=removed_locks,
        readable=readable,
        unreadable=unreadable,
        refs=refs,
        loose=loose,
        dead_packs=dict(dead_packs),
        chunks_in=dict(
            zip(dead_packs, chunks.map(_chunks_in, [(backend, p) for p in dead_packs]), strict=True)
        ),
    )


def sweep(
    backend: Backend,
    chunks: ChunkStore,
    lock: StoreLock,
    marked: Marked,
    load: Callable[[str], Manifest | None],
) -> Swept:
    """Under the exclusive lock, where no put is under way: mark from the manifests published
    since `mark` read, remove the markers of snapshots that have no manifest, and delete the
    indexes of the packs no manifest refers to still, and the loose chunks. A pack's data waits
    for `remove`: with its index gone no put can find a chunk in it (`PackIndex.refresh` forgets
    it), and no manifest refers to it."""
    listed = set(_manifest_ids(backend))
    refs = marked.refs
    readable, unreadable = _read(
        backend, chunks, load, sorted(listed - marked.readable - marked.unreadable), refs
    )
    readable |= marked.readable & listed
    unreadable |= marked.unreadable & listed
    # No put is under way: a marker without a manifest is debris.
    markers = (m for key in backend.list(EPISODE_PREFIX) if (m := split_episode_key(key)) is not None)
    dangling = [(episode, sid) for episode, sid in markers if sid not in listed]
    backend.delete(episode_key(e, sid) for e, sid in dangling)

    swept = not unreadable
    dead_packs = {p: keys for p, keys in marked.dead_packs.items() if p not in refs.packs} if swept else {}
    loose = [key for key in marked.loose if digest_of_key(key) not in refs.objects] if swept else []
    indexes = [key for keys in dead_packs.values() for key in keys if key.endswith(".idx")]
    freed = _delete(backend, chunks, lock, loose + indexes)
    report = GcReport(
        deleted_snapshots=marked.deleted_snapshots,
        kept_snapshots=len(readable),
        live_chunks=len(refs.hashes),
        deleted_chunks=len(loose) + sum(marked.chunks_in[p] for p in dead_packs),
        freed_bytes=freed,
        removed_markers=len(dangling),
        removed_locks=marked.removed_locks,
        removed_partial_files=0,
        swept=swept,
        unreadable=tuple(sorted(unreadable)),
    )
    pack_data = [key for keys in dead_packs.values() for key in keys if not key.endswith(".idx")]
    return Swept(report, pack_data)


def remove(
    backend: Backend, chunks: ChunkStore, locks: LockSettings, lock: StoreLock, swept: Swept
) -> GcReport:
    """After the sweep, under a shared lock again: delete the data of the packs whose indexes it
    deleted, and temp files of interrupted writes. A GC cut short before this leaves those packs'
    data behind, which the next one finds without an index and deletes."""
    freed = _delete(backend, chunks, lock, swept.pack_data)
    partial = backend.discard_partial(locks.stale_after_s)
    return replace(swept.report, freed_bytes=swept.report.freed_bytes + freed, removed_partial_files=partial)


def _delete(backend: Backend, chunks: ChunkStore, lock: StoreLock, keys: list[str]) -> int:
    """Delete `keys` in batches, checking before each that `lock` is held still (if it went
    stale, a writer may be live again); the bytes freed (indexes not counted)."""
    freed = 0
    for start in range(0, len(keys), _SWEEP_BATCH):
        batch = keys[start : start + _SWEEP_BATCH]
        freed += sum(
            size or 0
            for key, size in zip(batch, chunks.map(backend.size, batch), strict=True)
            if not key.endswith(".idx")
        )
        lock.ensure_held()
        backend.delete(batch)
    return freed


def _manifest_ids(backend: Backend) -> list[str]:
    return [found for key in backend.list(MANIFEST_PREFIX) if (found := manifest_id(key))]


def _load_all(
    chunks: ChunkStore, load: Callable[[str], Manifest | None], snapshot_ids: list[str]
) -> list[Manifest | None]:
    """Each snapshot's manifest; None where it is gone or cannot be read."""

    def load_quietly(snapshot_id: str) -> Manifest | None:
        try:
            return load(snapshot_id)
        except SnapshotCorrupt:
            return None

    return chunks.map(load_quietly, snapshot_ids)


def _read(
    backend: Backend,
    chunks: ChunkStore,
    load: Callable[[str], Manifest | None],
    snapshot_ids: list[str],
    refs: _Refs,
    loaded: Mapping[str, Manifest] | None = None,
) -> tuple[set[str], set[str]]:
    """Add what each snapshot's manifest refers to to `refs`, reading those not `loaded` already;
    the snapshots read, and those whose manifest is there but could not be read (their chunks
    cannot be told from garbage)."""
    loaded = loaded or {}
    unread = [sid for sid in snapshot_ids if sid not in loaded]
    read = dict(zip(unread, _load_all(chunks, load, unread), strict=True))
    readable: set[str] = set()
    unreadable: set[str] = set()
    for sid in snapshot_ids:
        manifest = loaded.get(sid) or read[sid]
        if manifest is not None:
            readable.add(sid)
            refs.add(manifest)
        elif backend.size(manifest_key(sid)) is not None:
            unreadable.add(sid)
    return readable, unreadable


def _chunks_in(item: tuple[Backend, str]) -> int:
    """How many chunks a pack holds, by its index (0 if that is gone or unreadable)."""
    backend, pack_id = item
    try:
        return len(decode_index(pack_id, backend.get(pack_index_key(pack_id))))
    except (ObjectMissing, ValueError, TypeError, KeyError):
        return 0
