"""Reading a stored file at any offset (`SnapshotStore.open_file`), as lazy restore does: exact
bytes across chunk boundaries, each chunk verified, damage named, and `fetch(leave_out=...)`."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from snapshots import (
    LockSettings,
    RetentionPolicy,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotStore,
    StoreLocked,
)
from snapshots._chunking import ChunkCodec
from tests.snapshots.conftest import damage, fast_settings, make_meta, make_tree

MEMORY = os.urandom(3 << 20)


@pytest.fixture
def stored(local_store: SnapshotStore, scratch: Path) -> SnapshotStore:
    local_store.put(make_tree(scratch / "tree", MEMORY), make_meta("s1"))
    return local_store


@pytest.mark.timeout(60)
def test_any_range_reads_back_exactly(stored: SnapshotStore) -> None:
    rng = random.Random(7)
    with stored.open_file("s1", "criu/pages-1.img") as f:
        assert f.size == len(MEMORY)
        for _ in range(200):
            offset = rng.randrange(len(MEMORY))
            length = rng.randrange(min(300_000, len(MEMORY) - offset) + 1)
            assert f.read(offset, length) == MEMORY[offset : offset + length]
            # The same bytes as views of the chunks they lie in, one per chunk, none empty.
            views = f.read_views(offset, length)
            assert b"".join(views) == MEMORY[offset : offset + length]
            assert all(len(v) for v in views) and all(isinstance(v.obj, bytes) for v in views)
        assert f.read(0, len(MEMORY)) == MEMORY
        assert f.read_views(5, 0) == []
        with pytest.raises(ValueError, match="cannot read 2 bytes at"):
            f.read(len(MEMORY) - 1, 2)


@pytest.mark.timeout(60)
def test_a_stream_without_read_ahead_fetches_only_the_chunks_it_reads(stored: SnapshotStore) -> None:
    with stored.open_file("s1", "criu/pages-1.img", read_ahead=False) as f, f.stream() as stream:
        stream.seek(1 << 20)
        assert stream.read(512) == MEMORY[(1 << 20) : (1 << 20) + 512]
        assert stream.tell() == (1 << 20) + 512
        stream.seek(-100, os.SEEK_END)
        assert stream.read() == MEMORY[-100:]
        assert stream.read(10) == b""
        # A chunk is at most 256 KiB: one under each read, two where a read straddles a boundary.
        assert f.fetched_bytes <= 4 * (256 << 10)


@pytest.mark.timeout(60)
def test_many_scattered_ranges_read_at_once_as_one_by_one(stored: SnapshotStore) -> None:
    rng = random.Random(11)
    ranges = [(0, 0), (len(MEMORY), 0), (0, 4096), (len(MEMORY) - 10, 10)]
    for _ in range(60):
        offset = rng.randrange(len(MEMORY))
        ranges.append((offset, rng.randrange(min(200_000, len(MEMORY) - offset) + 1)))
    with stored.open_file("s1", "criu/pages-1.img") as f:
        assert f.read_many(ranges) == [MEMORY[o : o + n] for o, n in ranges]
        assert f.read_many([]) == []
        with pytest.raises(ValueError, match="cannot read 2 bytes at"):
            f.read_many([(0, 1), (len(MEMORY) - 1, 2)])


@pytest.mark.timeout(60)
def test_a_damaged_chunk_is_named_when_its_range_is_read(stored: SnapshotStore, scratch: Path) -> None:
    entry = next(e for e in stored.manifest("s1").files() if e.path == "criu/pages-1.img")
    victim = entry.chunks[len(entry.chunks) // 2]
    damage(scratch / "store", victim)
    start = sum(r.length for r in entry.chunks[: len(entry.chunks) // 2])
    with stored.open_file("s1", "criu/pages-1.img") as f:
        assert f.read(0, 4096) == MEMORY[:4096], "chunks before it read fine"
        with pytest.raises(SnapshotCorrupt, match=f"criu/pages-1.img.*{victim.hash}"):
            f.read(start, 10)
        with pytest.raises(SnapshotCorrupt, match=f"criu/pages-1.img.*{victim.hash}"):
            f.read_many([(0, 4096), (start, 10), (len(MEMORY) - 4096, 4096)])
    with pytest.raises(FileNotFoundError, match=r"no file criu/missing\.img"):
        stored.open_file("s1", "criu/missing.img")


@pytest.mark.timeout(60)
def test_a_reader_fetches_and_opens_under_one_lock_until_closed(stored: SnapshotStore, scratch: Path) -> None:
    from snapshots._locks import read_locks  # test seam: the lock protocol is internal

    backend = stored._backend
    impatient = SnapshotStore(
        fast_settings(stored.settings.url, locks=LockSettings(gc_acquire_timeout_s=0.3))
    )
    with stored.reader("s1") as reader:
        assert list(read_locks(backend)) == [], "nothing is taken before the first read"
        reader.fetch(scratch / "out", leave_out=lambda path: path == "criu/pages-1.img")
        pages = reader.open("criu/pages-1.img")
        assert reader.open("criu/pages-1.img") is pages
        assert pages.read_many([(5, 100)]) == [MEMORY[5:105]]
        assert len(list(read_locks(backend))) == 1, "one shared lock for the fetch and every file"
        with pytest.raises(StoreLocked, match="read s1"):
            impatient.gc(RetentionPolicy(keep_last=1))
        with pytest.raises(FileNotFoundError, match=r"no file criu/missing\.img"):
            reader.open("criu/missing.img")
    assert list(read_locks(backend)) == []
    impatient.close()
    with pytest.raises(SnapshotNotFound), stored.reader("nope") as missing:
        missing.open("criu/pages-1.img")
    assert list(read_locks(backend)) == [], "a failed first read leaves no lock"


@pytest.mark.timeout(60)
def test_fetch_can_leave_files_for_later(stored: SnapshotStore, scratch: Path) -> None:
    stored.fetch("s1", scratch / "out", leave_out=lambda path: path == "criu/pages-1.img")
    left = scratch / "out" / "criu" / "pages-1.img"
    assert left.stat().st_size == len(MEMORY) and left.read_bytes() == bytes(len(MEMORY))
    assert (scratch / "out" / "checkpoint.json").read_text() == '{"sandbox_id": "sb-1"}'


@pytest.mark.timeout(60)
def test_reads_on_the_store_threads_do_not_wait_for_a_long_put(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lazy restore's reads ahead and side by side go to the store's threads; a put of another
    sandbox on the same node, which takes those threads item by item, must let them in between
    its items rather than after its last."""
    with SnapshotStore(fast_settings(f"file://{scratch}/store", io_threads=2)) as store:
        store.put(make_tree(scratch / "tree", MEMORY), make_meta("s1"))
        started = threading.Event()
        real_encode = ChunkCodec.encode

        def slow_encode(self: ChunkCodec, raw: memoryview | bytes) -> bytes:
            started.set()
            time.sleep(0.005)  # about 2 s for this put's 800 chunks on two threads
            return real_encode(self, raw)

        monkeypatch.setattr(ChunkCodec, "encode", slow_encode)
        putting = threading.Thread(
            target=store.put, args=(make_tree(scratch / "big", os.urandom(48 << 20)), make_meta("s2", seq=2))
        )
        putting.start()
        try:
            assert started.wait(30)
            with store.open_file("s1", "criu/pages-1.img") as f:
                begun = time.monotonic()
                far_apart = [(0, 4096), (len(MEMORY) // 2, 4096), (len(MEMORY) - 4096, 4096)]
                assert f.read_many(far_apart) == [MEMORY[o : o + n] for o, n in far_apart]
                waited = time.monotonic() - begun
            assert putting.is_alive(), "the reads waited for the whole put"
            assert waited < 1.0
        finally:
            putting.join()
        assert store.verify().ok
