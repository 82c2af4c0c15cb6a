"""Retention, mark-and-sweep, and the lock protocol that keeps GC from eating a live writer's chunks."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from snapshots import RetentionPolicy, SnapshotStore, StoreLocked
from tests.snapshots.conftest import fast_settings, make_meta, stored_chunks

KiB = 1024


def write_memory(tree: Path, content: bytes) -> Path:
    (tree / "criu").mkdir(parents=True, exist_ok=True)
    (tree / "criu" / "pages-1.img").write_bytes(content)
    (tree / "checkpoint.json").write_text("{}")
    return tree


@pytest.mark.timeout(60)
def test_retention_keeps_last_n_and_drops_ended_episodes(local_store: SnapshotStore, scratch: Path) -> None:
    shared = os.urandom(400 * KiB)
    for episode in ("ep-a", "ep-b", "ep-done"):
        parent = None
        for seq in range(1, 5):
            tree = write_memory(scratch / f"{episode}-{seq}", shared + os.urandom(200 * KiB))
            local_store.put(
                tree, make_meta(f"{episode}-{seq}", episode_id=episode, seq=seq, parent_id=parent)
            )
            parent = f"{episode}-{seq}"
    before = stored_chunks(scratch / "store")

    report = local_store.gc(RetentionPolicy(keep_last=2), ended_episodes={"ep-done"})

    assert [h.snapshot_id for h in local_store.history("ep-a")] == ["ep-a-3", "ep-a-4"]
    assert [h.snapshot_id for h in local_store.history("ep-b")] == ["ep-b-3", "ep-b-4"]
    assert local_store.history("ep-done") == []
    assert local_store.episodes() == ["ep-a", "ep-b"]
    assert set(report.deleted_snapshots) == {"ep-a-1", "ep-a-2", "ep-b-1", "ep-b-2"} | {
        f"ep-done-{i}" for i in range(1, 5)
    }
    assert report.kept_snapshots == 4 and report.swept
    after = stored_chunks(scratch / "store")
    assert report.deleted_chunks == len(before - after) > 0 and report.freed_bytes > 0
    # A delta chunk keeps its base.
    live = {(c.pack, c.hash) for h in local_store.history("ep-a") + local_store.history("ep-b")
            for e in local_store.manifest(h.snapshot_id).files() for r in e.chunks
            for c in (r, r.base) if c is not None}  # fmt: skip
    assert len({h for _p, h in live}) == report.live_chunks and live <= after
    # What stays besides: chunks of deleted snapshots in packs a kept snapshot still refers to.
    assert {p for p, _h in after} == {p for p, _h in live}
    verify = local_store.verify()
    assert verify.ok and len(verify.snapshots_checked) == 4
    # Shared chunks survived through the snapshots that still reference them.
    out = scratch / "out"
    local_store.fetch("ep-a-4", out)
    assert (out / "criu" / "pages-1.img").read_bytes()[: len(shared)] == shared


@pytest.mark.timeout(60)
def test_a_fork_childs_resume_point_stays_after_its_parent_ended_or_moved_on(
    local_store: SnapshotStore, scratch: Path
) -> None:
    """A fork child resumes from its parent's snapshot: GC keeps it while the child lives, past
    the parent's keep_last and after the parent ended, and drops it once no live episode names it."""
    for episode in ("ep-parent", "ep-live"):
        parent = None
        for seq in range(1, 4):
            tree = write_memory(scratch / f"{episode}-{seq}", os.urandom(100 * KiB))
            local_store.put(
                tree, make_meta(f"{episode}-{seq}", episode_id=episode, seq=seq, parent_id=parent)
            )
            parent = f"{episode}-{seq}"
    child_points = {"ep-child-a": "ep-parent-1", "ep-child-b": "ep-live-1", "ep-live": "ep-live-3"}

    report = local_store.gc(
        RetentionPolicy(keep_last=1), ended_episodes={"ep-parent"}, resume_points=child_points
    )

    assert [h.snapshot_id for h in local_store.history("ep-parent")] == ["ep-parent-1"]
    assert [h.snapshot_id for h in local_store.history("ep-live")] == ["ep-live-1", "ep-live-3"]
    assert set(report.deleted_snapshots) == {"ep-parent-2", "ep-parent-3", "ep-live-2"}
    assert local_store.verify().ok
    local_store.fetch("ep-parent-1", scratch / "out")  # whole: its chunks were marked

    report = local_store.gc(RetentionPolicy(keep_last=1), ended_episodes={"ep-parent"})
    assert local_store.history("ep-parent") == [] and report.deleted_snapshots == ("ep-live-1", "ep-parent-1")


@pytest.mark.timeout(30)
def test_retention_must_keep_the_resume_point() -> None:
    from snapshots import InvalidSettings

    with pytest.raises(InvalidSettings):
        RetentionPolicy(keep_last=0)


def _gc_is_refused(store: SnapshotStore, holder: str) -> None:
    """A GC of `store` that waits half a second for its lock is refused, naming the lock held
    for `holder`."""
    impatient = SnapshotStore(
        fast_settings(store.settings.url, locks=store.settings.locks.__class__(gc_acquire_timeout_s=0.5))
    )
    try:
        with pytest.raises(StoreLocked, match=holder):
            impatient.gc(RetentionPolicy(keep_last=1))
    finally:
        impatient.close()


@pytest.mark.timeout(60)
def test_gc_waits_out_a_live_writer_and_a_writer_waits_out_gc(scratch: Path) -> None:
    url = f"file://{scratch}/store"
    with SnapshotStore(fast_settings(url)) as store:
        tree = write_memory(scratch / "tree", os.urandom(256 * KiB))
        store.put(tree, make_meta("s1"))
        # Hold a writer's shared lock by hand: GC must refuse to sweep while it exists.
        from snapshots._locks import LockKind, StoreLock

        backend = store._backend  # Test seam: the lock protocol is internal.
        writer = StoreLock(backend, store.settings.locks, LockKind.SHARED, "test writer").acquire(5)
        try:
            _gc_is_refused(store, "test writer")
        finally:
            writer.release()
        gc_lock = StoreLock(backend, store.settings.locks, LockKind.EXCLUSIVE, "test gc").acquire(5)
        done = threading.Event()

        def put_second() -> None:
            store.put(tree, make_meta("s2", seq=2, parent_id="s1"))
            done.set()

        thread = threading.Thread(target=put_second)
        thread.start()
        time.sleep(0.5)
        assert not done.is_set(), "a writer must not run while GC holds the exclusive lock"
        gc_lock.release()
        thread.join(timeout=20)
        assert done.is_set()
        assert store.verify().ok


@pytest.mark.timeout(90)
def test_gc_racing_writers_never_loses_a_referenced_chunk(scratch: Path) -> None:
    """Writers in threads put snapshots that share most chunks with ones GC is deleting; GC loops meanwhile."""
    url = f"file://{scratch}/store"
    base = [os.urandom(64 * KiB) for _ in range(24)]
    errors: list[BaseException] = []
    stop = threading.Event()
    puts = {"count": 0}
    sweeps = {"count": 0, "deleted": 0, "busy": 0}

    def writer(worker: int) -> None:
        rng = random.Random(worker)
        with SnapshotStore(fast_settings(url, io_threads=2)) as store:
            parent = None
            seq = 0
            while not stop.is_set():
                seq += 1
                # Mostly shared chunks (deduplicated, never re-uploaded) plus a few fresh ones.
                pieces = [rng.choice(base) for _ in range(12)] + [rng.randbytes(64 * KiB) for _ in range(2)]
                tree = write_memory(scratch / f"w{worker}-{seq}", b"".join(pieces))
                sid = f"w{worker}-{seq}"
                try:
                    store.put(tree, make_meta(sid, episode_id=f"ep-{worker}", seq=seq, parent_id=parent))
                except BaseException as exc:
                    errors.append(exc)
                    return
                parent = sid
                puts["count"] += 1
                time.sleep(rng.uniform(0, 0.03))

    def collector() -> None:
        with SnapshotStore(fast_settings(url)) as store:
            while not stop.is_set():
                try:
                    report = store.gc(RetentionPolicy(keep_last=1))
                    sweeps["count"] += 1
                    sweeps["deleted"] += report.deleted_chunks
                except StoreLocked:
                    sweeps["busy"] += 1
                except BaseException as exc:
                    errors.append(exc)
                    return
                # A gap between sweeps, as between a control loop's: back to back, the sweeps held
                # the exclusive lock nearly all the time, and a slow run saw 8 puts in 25 s.
                stop.wait(0.01)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)] + [
        threading.Thread(target=collector)
    ]
    for t in threads:
        t.start()
    # 25 s for plenty of both; on a machine busy with the rest of the suite, up to 55 s for the
    # least the checks below need (a sweep can take seconds there).
    started = time.monotonic()

    def more_wanted() -> bool:
        waited = time.monotonic() - started
        if waited < 25 and (sweeps["count"] < 8 or puts["count"] < 30):
            return True
        return waited < 55 and (sweeps["count"] < 3 or puts["count"] < 10)

    while not errors and more_wanted():
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    print(
        f"\n{puts['count']} puts, {sweeps['count']} sweeps deleting {sweeps['deleted']} chunks, {sweeps['busy']} busy"
    )
    assert sweeps["count"] >= 3 and sweeps["deleted"] > 0 and puts["count"] >= 10

    with SnapshotStore(fast_settings(url)) as store:
        report = store.verify()
        assert report.ok, [str(p) for p in report.problems]
        assert len(report.snapshots_checked) >= 3
        for sid in report.snapshots_checked:
            store.fetch(sid, scratch / f"check-{sid}")


@pytest.mark.timeout(60)
def test_a_put_during_the_mark_goes_on_and_keeps_the_garbage_it_reuses(
    store: SnapshotStore, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC marks under a shared lock: a put goes on meanwhile, and may reuse chunks the mark found
    no manifest for (a snapshot retention just removed). The sweep marks again from the manifests
    published since, so those chunks stay. The mark is held open here until the put is done."""
    from snapshots import _gc

    memory = os.urandom(512 * KiB)
    store.put(write_memory(scratch / "old", memory), make_meta("old", seq=1))
    unrelated = scratch / "new"  # shares no chunk with the old snapshot
    unrelated.mkdir()
    (unrelated / "memory.img").write_bytes(os.urandom(256 * KiB))
    store.put(unrelated, make_meta("new", seq=2))
    marks: list[_gc.Marked] = []
    put_done = threading.Event()
    real_mark = _gc.mark

    def mark_then_wait(*args: object, **kwargs: object) -> _gc.Marked:
        marks.append(real_mark(*args, **kwargs))  # type: ignore[arg-type]
        assert put_done.wait(30), "the put waited for GC's mark"
        return marks[0]

    monkeypatch.setattr(_gc, "mark", mark_then_wait)  # Test seam: the pause between mark and sweep.
    reports: list[_gc.GcReport] = []
    gc = threading.Thread(target=lambda: reports.append(store.gc(RetentionPolicy(keep_last=1))))
    gc.start()
    try:
        deadline = time.monotonic() + 30
        while not marks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not store.exists("old"), "retention removed the old snapshot before the mark"
        # Another episode's first snapshot holds the old one's memory: its chunks are reused.
        again = store.put(write_memory(scratch / "again", memory), make_meta("again", episode_id="ep-2"))
    finally:
        put_done.set()
        gc.join(timeout=30)
    reused = {ref.pack for entry in again.files() for ref in entry.chunks}
    assert reused & set(marks[0].dead_packs), "the put reused chunks of a pack the mark found dead"
    assert again.sizes.new_bytes < len(memory) // 4
    (report,) = reports
    assert report.swept and report.deleted_snapshots == ("old",) and report.kept_snapshots == 2
    verify = store.verify()
    assert verify.ok, [str(p) for p in verify.problems]
    store.fetch("again", scratch / "out")
    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == memory


@pytest.mark.timeout(60)
def test_a_gc_cut_short_after_its_sweep_leaves_data_that_no_put_reuses_and_the_next_gc_removes(
    store: SnapshotStore, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep deletes dead packs' indexes under the exclusive lock, and their data after it,
    beside puts again. A GC that dies in between leaves data no index names: a put does not reuse
    a chunk of it, the store verifies, and the next GC deletes it."""
    from snapshots import _gc
    from snapshots._layout import PACK_PREFIX, split_pack_key

    def packs() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for key in store._backend.list(PACK_PREFIX):  # Test seam: the store's own objects.
            if (parsed := split_pack_key(key)) is not None:
                found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    memory = os.urandom(512 * KiB)
    store.put(write_memory(scratch / "old", memory), make_meta("old", seq=1))
    old_packs = set(packs())
    unrelated = scratch / "new"  # shares no chunk with the old snapshot
    unrelated.mkdir()
    (unrelated / "memory.img").write_bytes(os.urandom(256 * KiB))
    store.put(unrelated, make_meta("new", seq=2))

    def dies(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the collector's host went away (injected)")

    with monkeypatch.context() as patched:
        patched.setattr(_gc, "remove", dies)
        with pytest.raises(RuntimeError, match="injected"):
            store.gc(RetentionPolicy(keep_last=1))
    orphans = {pack for pack, kinds in packs().items() if kinds == {"pack"}}
    assert orphans and orphans <= old_packs, "the old snapshot's packs lost their indexes only"

    again = store.put(write_memory(scratch / "again", memory), make_meta("again", episode_id="ep-2"))
    assert not {ref.pack for entry in again.files() for ref in entry.chunks} & orphans
    assert store.verify().ok
    report = store.gc(RetentionPolicy(keep_last=1))
    assert not set(packs()) & orphans and report.freed_bytes >= len(memory) // 2
    store.fetch("again", scratch / "out")
    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == memory


def _foreign_lock(
    store: SnapshotStore, purpose: str, refreshed: float, host: str = "node-elsewhere", pidns: str = "p"
) -> str:
    """A shared lock as a live writer on another host writes it, dated `refreshed` by its clock."""
    key = f"locks/{uuid.uuid4().hex}.json"
    doc = {"kind": "shared", "host": host, "boot_id": "b", "pidns": pidns, "pid": 7,
           "purpose": purpose, "refreshed": refreshed}  # fmt: skip
    store._backend.put(key, json.dumps(doc).encode())  # Test seam: the lock protocol is internal.
    return key


@pytest.mark.timeout(60)
def test_a_writer_whose_clock_lags_still_keeps_gc_away(store: SnapshotStore) -> None:
    """Its lock says it was refreshed an hour ago by its own clock; the store wrote it just now."""
    key = _foreign_lock(store, "writer with a slow clock", refreshed=time.time() - 3600)
    _gc_is_refused(store, "writer with a slow clock")
    assert key in list(store._backend.list("locks/")), "a live lock is not removed as stale"


@pytest.mark.timeout(60)
def test_a_writer_on_another_machine_with_our_hostname_still_keeps_gc_away(store: SnapshotStore) -> None:
    """Pods and cloned machines share host names: a holder with ours but another boot id may be
    alive on another kernel, so only its lock's expiry frees the store."""
    key = _foreign_lock(store, "namesake writer", time.time(), host=socket.gethostname(), pidns=_our_pidns())
    _gc_is_refused(store, "namesake writer")
    assert key in list(store._backend.list("locks/")), "a live lock is not removed as stale"


def _our_pidns() -> str:
    return os.readlink("/proc/self/ns/pid")


@pytest.mark.timeout(60)
def test_a_lock_the_store_has_not_seen_refreshed_is_stale_whatever_its_holder_says(
    local_store: SnapshotStore, scratch: Path
) -> None:
    """Its holder's clock says it is fresh; by the store's, it was last written long ago."""
    key = _foreign_lock(local_store, "writer gone quiet", refreshed=time.time() + 3600)
    long_ago = time.time() - local_store.settings.locks.stale_after_s - 60
    os.utime(scratch / "store" / key, (long_ago, long_ago))
    report = local_store.gc(RetentionPolicy(keep_last=1))
    assert report.removed_locks == 1
    assert list(local_store._backend.list("locks/")) == []
