"""Content-defined chunking deduplicates a memory image that changed in a few places; a restore
reads a chunk it writes in many places once."""

from __future__ import annotations

import gc
import json
import random
from collections import Counter
from pathlib import Path

import blake3
import pytest

from snapshots import ChunkingSettings, InvalidSettings, Manifest, SnapshotCorrupt, SnapshotStore, _chunkstore
from snapshots._backends import LocalBackend
from tests.snapshots.conftest import damage, fast_settings, make_meta

KiB = 1 << 10
MiB = 1 << 20


@pytest.mark.timeout(90)
def test_second_snapshot_after_ten_percent_change_adds_at_most_quarter(
    local_store: SnapshotStore, scratch: Path
) -> None:
    rng = random.Random(42)
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    memory = bytearray(rng.randbytes(64 * MiB))
    (tree / "criu" / "pages-1.img").write_bytes(memory)
    first = local_store.put(tree, make_meta("s1", seq=1))

    # Four contiguous page-aligned regions of 1.6 MiB each: 10% of the image, spread across it.
    region = (64 * MiB // 10) // 4 // 4096 * 4096
    for i in range(4):
        start = (i * 16 * MiB + rng.randrange(0, 16 * MiB - region)) // 4096 * 4096
        memory[start : start + region] = rng.randbytes(region)
    (tree / "criu" / "pages-1.img").write_bytes(memory)
    second = local_store.put(tree, make_meta("s2", seq=2, parent_id="s1"))

    share = second.sizes.new_bytes / first.sizes.stored_bytes
    print(
        f"\nsecond snapshot added {second.sizes.new_bytes / MiB:.2f} MiB = {share:.1%} of the first's "
        f"{first.sizes.stored_bytes / MiB:.2f} MiB ({second.sizes.new_chunks} of {second.sizes.unique_chunks} chunks new)"
    )
    assert share <= 0.25
    assert second.sizes.stored_bytes >= first.sizes.stored_bytes * 0.95

    out = scratch / "out"
    local_store.fetch("s2", out)
    assert (out / "criu" / "pages-1.img").read_bytes() == memory


@pytest.mark.timeout(60)
def test_zero_pages_collapse_to_one_chunk(local_store: SnapshotStore, scratch: Path) -> None:
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "criu" / "pages-1.img").write_bytes(bytes(16 * MiB))
    manifest = local_store.put(tree, make_meta("zeros"))
    assert manifest.sizes.unique_chunks == 1
    assert manifest.sizes.stored_bytes < 64 * 1024
    assert manifest.sizes.dedup_ratio > 1000


@pytest.mark.timeout(60)
def test_an_index_naming_chunks_past_its_pack_is_not_trusted_for_dedup(scratch: Path) -> None:
    """Another writer's pack index decides what a put need not upload again: one that names
    chunks past the end of its pack would make every later snapshot unrestorable."""
    url = f"file://{scratch / 'store'}"
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "criu" / "pages-1.img").write_bytes(random.Random(4).randbytes(2 * MiB))
    with SnapshotStore.open(url) as first:
        first.put(tree, make_meta("s1"))
    (index,) = (scratch / "store" / "packs").glob("*.idx")
    doc = json.loads(index.read_text())
    doc["chunks"] = [
        [digest, length, offset + (1 << 40), stored] for digest, length, offset, stored in doc["chunks"]
    ]
    index.write_text(json.dumps(doc))
    with SnapshotStore.open(url) as second:  # learns the packs afresh
        put = second.put(tree, make_meta("s2", seq=2))
        assert put.sizes.new_bytes > 1 * MiB, "the chunks were uploaded again, not taken from the bad index"
        assert second.verify("s2").ok
        second.fetch("s2", scratch / "out")
    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == (
        tree / "criu" / "pages-1.img"
    ).read_bytes()


_ZERO_CHUNK = blake3.blake3(bytes(256 * 1024)).hexdigest()


def _zero_chunk_reads(monkeypatch: pytest.MonkeyPatch, manifest: Manifest) -> list[int]:
    """Count the backend reads that cover the stored zero chunk (one element per read)."""
    (zero,) = {ref for entry in manifest.files() for ref in entry.chunks if ref.hash == _ZERO_CHUNK}
    reads: list[int] = []
    real = LocalBackend.get_range

    def counting(self: LocalBackend, key: str, offset: int, length: int) -> bytes:
        if key.endswith(f"{zero.pack}.pack") and offset <= zero.offset < offset + length:
            reads.append(offset)
        return real(self, key, offset, length)

    monkeypatch.setattr(LocalBackend, "get_range", counting)
    return reads


def _zero_runs_tree(scratch: Path) -> tuple[Path, bytes]:
    """Two page images whose zero runs make one 256 KiB chunk, written 40 times in all."""
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    block = random.Random(5).randbytes(1 * MiB)
    pages = bytes(6 * MiB) + block + bytes(4 * MiB)
    (tree / "criu" / "pages-1.img").write_bytes(pages)
    (tree / "criu" / "pages-2.img").write_bytes(bytes(4 * MiB))
    return tree, pages


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kept_bytes", [64 * MiB, 0], ids=["kept", "budget-spent"])
def test_a_chunk_written_in_many_places_is_read_once_not_once_per_place(
    scratch: Path, monkeypatch: pytest.MonkeyPatch, kept_bytes: int
) -> None:
    """A restore reads, decompresses and verifies a repeated chunk once (once per thread if the
    threads meet it at the same moment) and writes it everywhere it belongs; past the memory it
    may keep for repeats, it reads them again, with the same result."""
    tree, pages = _zero_runs_tree(scratch)
    with SnapshotStore(fast_settings(f"file://{scratch}/store", io_threads=2)) as store:
        manifest = store.put(tree, make_meta("s1"))
        places = sum(ref.hash == _ZERO_CHUNK for entry in manifest.files() for ref in entry.chunks)
        assert places >= 30
        monkeypatch.setattr(_chunkstore, "_REPEATS_KEPT_BYTES", kept_bytes)
        reads = _zero_chunk_reads(monkeypatch, manifest)

        store.fetch("s1", scratch / "out")

    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == pages
    assert (scratch / "out" / "criu" / "pages-2.img").read_bytes() == bytes(4 * MiB)
    if kept_bytes:
        assert 1 <= len(reads) <= 2
    else:
        assert len(reads) >= places - 1  # a run may read the chunk with its neighbour once


@pytest.mark.timeout(60)
def test_a_damaged_chunk_written_in_many_places_fails_the_restore(
    local_store: SnapshotStore, scratch: Path
) -> None:
    tree, _pages = _zero_runs_tree(scratch)
    manifest = local_store.put(tree, make_meta("s1"))
    (zero,) = {ref for entry in manifest.files() for ref in entry.chunks if ref.hash == _ZERO_CHUNK}
    damage(scratch / "store", zero)

    with pytest.raises(SnapshotCorrupt) as caught:
        local_store.fetch("s1", scratch / "out")

    assert caught.value.chunk == _ZERO_CHUNK and caught.value.path.startswith("criu/pages-")
    assert not (scratch / "out").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.timeout(60)
def test_chunks_average_the_configured_size(local_store: SnapshotStore, scratch: Path) -> None:
    """FastCDC 2020 skips min_size bytes before it looks for a cut; asked for the rest, its
    chunks of random bytes average avg_size and stay within min_size and max_size."""
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "criu" / "pages-1.img").write_bytes(random.Random(6).randbytes(32 * MiB))
    manifest = local_store.put(tree, make_meta("s1"))
    settings = ChunkingSettings()
    (entry,) = manifest.files()
    lengths = [ref.length for ref in entry.chunks]
    mean = sum(lengths) / len(lengths)
    print(f"\n{len(lengths)} chunks, mean {mean / 1024:.1f} KiB")
    assert 0.85 * settings.avg_size <= mean <= 1.15 * settings.avg_size
    assert all(settings.min_size <= n <= settings.max_size for n in lengths[:-1])
    assert manifest.chunking["algorithm"] == "fastcdc-2020"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("sizes", "problem"),
    [
        ((16 * KiB, 24 * KiB, 256 * KiB), "min_size <= avg_size - min_size"),
        ((64, 256, 4 * KiB), "from 256 bytes"),
        ((2 * MiB, 8 * MiB, 16 * MiB), "min_size up to 1 MiB"),
        ((16 * KiB, 64 * KiB, 32 * MiB), "max_size from 1 KiB to 16 MiB"),
    ],
)
def test_chunk_sizes_the_chunker_cannot_make_are_refused(sizes: tuple[int, int, int], problem: str) -> None:
    low, mean, high = sizes
    with pytest.raises(InvalidSettings) as caught:
        ChunkingSettings(min_size=low, avg_size=mean, max_size=high)
    assert caught.value.field == "chunking" and problem in str(caught.value)


def _small_files_tree(scratch: Path) -> Path:
    """A checkpoint's many small image files (a few hundred bytes to a few KiB each) beside its
    large page image."""
    rng = random.Random(7)
    tree = scratch / "tree"
    (tree / "criu").mkdir(parents=True)
    for i in range(40):
        (tree / "criu" / f"core-{i}.img").write_bytes(rng.randbytes(rng.randrange(30, 6 * KiB)))
    (tree / "criu" / "pages-1.img").write_bytes(rng.randbytes(3 * MiB))
    return tree


@pytest.mark.timeout(60)
def test_small_files_are_read_together_each_verified_and_a_damaged_one_is_named(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore reads the small files whose chunks lie together in a pack with a few requests
    (the put's threads may store a large file's chunks between them), not one each, and still
    verifies each file's chunk: a damaged one among them fails the fetch naming its own file,
    and no partial tree is left."""
    tree = _small_files_tree(scratch)
    with SnapshotStore(fast_settings(f"file://{scratch}/store", io_threads=2)) as store:
        manifest = store.put(tree, make_meta("s1"))
        small = [e for e in manifest.files() if e.path.startswith("criu/core-")]
        packs = {ref.pack for entry in small for ref in entry.chunks}
        reads: list[tuple[str, int]] = []
        real = LocalBackend.get_range

        def counting(self: LocalBackend, key: str, offset: int, length: int) -> bytes:
            if any(key.endswith(f"{pack}.pack") for pack in packs) and length < 1 * MiB:
                reads.append((key, length))
            return real(self, key, offset, length)

        monkeypatch.setattr(LocalBackend, "get_range", counting)
        store.fetch("s1", scratch / "out", leave_out=lambda path: path == "criu/pages-1.img")
        for entry in small:
            assert (scratch / "out" / entry.path).read_bytes() == (tree / entry.path).read_bytes()
        assert len(small) == 40 and 1 <= len(reads) <= 4, reads

        victim = small[23]
        damage(scratch / "store", victim.chunks[0])
        with pytest.raises(SnapshotCorrupt) as caught:
            store.fetch("s1", scratch / "again")

    assert caught.value.path == victim.path and caught.value.chunk == victim.chunks[0].hash
    assert not (scratch / "again").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".again")] == []


@pytest.mark.timeout(60)
def test_a_put_and_a_fetch_leave_no_chunk_refs_in_cycles(local_store: SnapshotStore, scratch: Path) -> None:
    """What a put or a fetch held (its files' chunk refs, the work its threads shared) goes when it
    returns, by reference counting: left in a cycle, it would wait for the next cyclic collection,
    which an agent holds off while it restores."""
    tree = _small_files_tree(scratch)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        local_store.put(tree, make_meta("s1"))
        local_store.fetch("s1", scratch / "out")
        gc.collect()
        left = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    pages = "criu/pages-1.img"
    assert (scratch / "out" / pages).read_bytes() == (tree / pages).read_bytes()
    assert not {"ChunkRef", "Located", "_Piece"} & set(left), left
