"""Delta chunks: a chunk that changed since the parent snapshot is stored against the parent's copy."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from snapshots import (
    DELTA_FORMAT,
    FORMAT,
    Alignment,
    Manifest,
    RetentionPolicy,
    Segment,
    SnapshotCorrupt,
    SnapshotStore,
)
from snapshots._deltas import worth_a_delta
from snapshots._layout import manifest_key
from tests.snapshots.conftest import damage, fast_settings, make_meta, make_tree

PAGE = 4096
PAGES = 1024  # 4 MiB


def heap(seed: int = 1) -> bytearray:
    """Compressible pages, as an interpreter's heap is: words from a small vocabulary."""
    rng = random.Random(seed)
    words = [f"observation-{i}".encode() for i in range(500)]
    out = bytearray()
    while len(out) < PAGES * PAGE:
        out += rng.choice(words) + b" "
    return out[: PAGES * PAGE]


def touch(memory: bytearray, every: int, salt: int) -> bytearray:
    """A copy with 16 bytes changed in every `every`th page: scattered, as a heap changes."""
    out = bytearray(memory)
    rng = random.Random(salt)
    for page in range(0, PAGES, every):
        at = page * PAGE + rng.randrange(PAGE - 16)
        out[at : at + 16] = rng.randbytes(16)
    return out


def pages(manifest: Manifest) -> tuple:
    return next(e for e in manifest.files() if e.path == "criu/pages-1.img").chunks


def put(
    store: SnapshotStore, tree: Path, memory: bytes, sid: str, seq: int, parent: str | None, **kw
) -> Manifest:
    (tree / "criu" / "pages-1.img").write_bytes(memory)
    return store.put(tree, make_meta(sid, seq=seq, parent_id=parent), **kw)


@pytest.mark.timeout(60)
def test_changed_chunks_are_stored_against_the_parents_and_read_back_exactly(
    store: SnapshotStore, scratch: Path
) -> None:
    tree = make_tree(scratch / "tree")
    first = heap()
    second = touch(first, 8, 2)  # one page in 8: every 64 KiB chunk has changed
    third = touch(second, 8, 3)
    m1 = put(store, tree, first, "s1", 1, None)
    m2 = put(store, tree, second, "s2", 2, "s1")

    deltas = [c for c in pages(m2) if c.base is not None]
    assert len(deltas) > len(pages(m2)) // 2
    assert {c.base for c in deltas} <= set(pages(m1)), "each base is the parent's chunk"
    # Without deltas every changed chunk would be stored again, about what the first one took.
    assert m2.sizes.new_bytes < m1.sizes.stored_bytes / 5
    assert json.loads(store._backend.get(manifest_key("s2")))["format"] == DELTA_FORMAT
    assert json.loads(store._backend.get(manifest_key("s1")))["format"] == FORMAT
    assert store.manifest("s2") == m2

    out = scratch / "out"
    store.fetch("s2", out)
    assert (out / "criu" / "pages-1.img").read_bytes() == second
    with store.open_file("s2", "criu/pages-1.img") as f:
        for offset, length in ((0, 10), (12345, 70_000), (PAGES * PAGE - 5000, 5000), (2 * PAGE, 3 * 65536)):
            assert f.read(offset, length) == second[offset : offset + length]
        assert f.read_many([(100, 200), (3 << 20, 9000)]) == [
            second[100:300],
            second[3 << 20 : (3 << 20) + 9000],
        ]
    assert store.verify("s2").ok

    # An unchanged third snapshot reuses its parent's delta chunks; a changed one is stored
    # against a plain chunk, the base of the parent's delta, never against a delta.
    m3 = put(store, tree, second, "s3", 3, "s2")
    assert m3.sizes.new_bytes == 0 and pages(m3) == pages(m2)
    m4 = put(store, tree, third, "s4", 4, "s3")
    assert all(c.base is None or c.base.base is None for c in pages(m4))
    assert {c.base for c in pages(m4) if c.base} <= set(pages(m1))
    assert m4.sizes.new_bytes < m1.sizes.stored_bytes / 5
    store.fetch("s4", scratch / "out4")
    assert (scratch / "out4" / "criu" / "pages-1.img").read_bytes() == third

    # Another episode with the same bytes stores nothing new: delta chunks deduplicate too.
    (tree / "criu" / "pages-1.img").write_bytes(third)
    other = store.put(tree, make_meta("other", episode_id="ep-2"))
    assert other.sizes.new_bytes == 0
    store.fetch("other", scratch / "out5")
    assert (scratch / "out5" / "criu" / "pages-1.img").read_bytes() == third


@pytest.mark.timeout(60)
def test_a_chunk_that_changed_whole_is_stored_plainly(local_store: SnapshotStore, scratch: Path) -> None:
    """A delta is read with its base, so it is kept only where it saves most of the chunk."""
    tree = make_tree(scratch / "tree")
    first = heap()
    second = bytearray(first)
    second[: 1 << 20] = random.Random(5).randbytes(1 << 20)  # a megabyte rewritten with noise
    put(local_store, tree, first, "s1", 1, None)
    m2 = put(local_store, tree, second, "s2", 2, "s1")
    starts, at = [], 0
    for c in pages(m2):
        starts.append((at, c))
        at += c.length
    assert all(c.base is None for offset, c in starts if offset + c.length <= 1 << 20)


def _moved(memory: bytes) -> bytes:
    """`memory` after a new 256 KiB mapping came before it: every page sits 256 KiB later."""
    return heap(9)[: 256 << 10] + memory


def _align(root: Path, read: Callable[[str], bytes | None]) -> Mapping[str, Alignment]:
    assert read("criu/nested/deeper/core-1.img") == b"core" * 5000, "the parent's files are readable"
    assert read("criu/no-such.img") is None
    return {"criu/pages-1.img": Alignment("criu/pages-1.img", [Segment(256 << 10, 0, PAGES * PAGE)])}


@pytest.mark.timeout(60)
def test_pages_that_moved_are_stored_against_where_they_sat(scratch: Path) -> None:
    first = heap()
    second = _moved(touch(first, 8, 2))
    new_bytes = {}
    for aligned in (False, True):
        with SnapshotStore(fast_settings(f"file://{scratch}/store-{aligned}")) as store:
            tree = make_tree(scratch / f"tree-{aligned}")
            m1 = put(store, tree, first, "s1", 1, None)
            m2 = put(store, tree, second, "s2", 2, "s1", aligner=_align if aligned else None)
            new_bytes[aligned] = m2.sizes.new_bytes
            store.fetch("s2", scratch / f"out-{aligned}")
            assert (scratch / f"out-{aligned}" / "criu" / "pages-1.img").read_bytes() == second
    assert new_bytes[True] < new_bytes[False] / 2 and new_bytes[True] < m1.sizes.stored_bytes / 4


@pytest.mark.timeout(60)
def test_an_aligner_that_fails_costs_deltas_not_the_put(local_store: SnapshotStore, scratch: Path) -> None:
    def broken(root: Path, read: Callable[[str], bytes | None]) -> Mapping[str, Alignment]:
        raise ValueError("pagemap-1.img is damaged")

    tree = make_tree(scratch / "tree")
    put(local_store, tree, heap(), "s1", 1, None)
    m2 = put(local_store, tree, touch(heap(), 8, 2), "s2", 2, "s1", aligner=broken)
    assert any(c.base for c in pages(m2)), "the file is taken to sit where it sat"
    assert local_store.verify("s2").ok


@pytest.mark.timeout(60)
def test_a_delta_keeps_its_base_when_the_parent_goes(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    second = touch(heap(), 8, 2)
    put(local_store, tree, heap(), "s1", 1, None)
    put(local_store, tree, second, "s2", 2, "s1")
    local_store.delete("s1")
    report = local_store.gc(RetentionPolicy(keep_last=5))
    assert report.swept and report.kept_snapshots == 1
    assert local_store.verify().ok
    local_store.fetch("s2", scratch / "out")
    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == second


@pytest.mark.timeout(60)
def test_a_damaged_base_fails_each_delta_on_it_by_name(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    put(local_store, tree, heap(), "s1", 1, None)
    m2 = put(local_store, tree, touch(heap(), 8, 2), "s2", 2, "s1")
    delta = next(c for c in pages(m2) if c.base is not None)
    damage(scratch / "store", delta.base)

    with pytest.raises(SnapshotCorrupt, match=f"its base {delta.base.hash}") as caught:
        local_store.fetch("s2", scratch / "out")
    assert caught.value.snapshot_id == "s2" and caught.value.path == "criu/pages-1.img"
    assert not (scratch / "out").exists()
    report = local_store.verify("s2")
    assert any(p.chunk == delta.hash and delta.base.hash in p.detail for p in report.problems)
    # A later snapshot never takes a damaged chunk as a base: it stores its chunk plainly.
    m3 = put(local_store, tree, touch(heap(), 8, 3), "s3", 3, "s2")
    assert delta.base not in {c.base for c in pages(m3)}
    assert local_store.verify("s3").ok


@pytest.mark.timeout(60)
def test_a_manifest_with_bad_bases_is_corrupt(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    put(local_store, tree, heap(), "s1", 1, None)
    put(local_store, tree, touch(heap(), 8, 2), "s2", 2, "s1")
    key = scratch / "store" / manifest_key("s2")
    good = json.loads(key.read_bytes())
    table = next(e for e in good["entries"] if e["path"] == "criu/pages-1.img")["chunks"]

    def corrupt(change: Callable[[dict], object], expected: str) -> None:
        doc = json.loads(json.dumps(good))
        change(doc)
        key.write_text(json.dumps(doc))
        with pytest.raises(SnapshotCorrupt, match=expected):
            local_store.manifest("s2")

    def chunks(doc: dict) -> dict:
        return next(e for e in doc["entries"] if e["path"] == "criu/pages-1.img")["chunks"]

    corrupt(lambda d: d.update(format=FORMAT), "only a stasis.snapshot/v4 manifest gives")
    corrupt(lambda d: chunks(d)["base"].__setitem__(0, len(table["bases"]["lengths"])), "names base")
    corrupt(lambda d: chunks(d)["base"].pop(), "one integer per chunk")
    corrupt(lambda d: chunks(d)["bases"]["pack"].__setitem__(0, len(table["packs"])), "names pack")
    corrupt(lambda d: chunks(d)["bases"].__setitem__("hashes", "x" * 64), "BLAKE3 digests")


def test_a_delta_is_tried_only_where_the_base_still_holds_the_chunks_bytes() -> None:
    """Compressing a chunk against a base costs 20 times what storing it plainly costs on random
    bytes, so a chunk is first sampled against the base where its bytes sat."""
    rng = random.Random(6)
    base, noise = rng.randbytes(65536), rng.randbytes(65536)
    one_page_changed = base[:8192] + noise[:4096] + base[12288:]
    assert worth_a_delta(memoryview(one_page_changed), base, 0)
    assert not worth_a_delta(memoryview(noise), base, 0), "changed whole"
    # The chunk's bytes sat 5000 bytes into the base: sampled there.
    assert worth_a_delta(memoryview(base[5000:40000]), base, 5000)
    assert not worth_a_delta(memoryview(base[5000:40000]), base, 0)
    assert worth_a_delta(memoryview(noise), base, None), "where they sat is unknown: tried"
