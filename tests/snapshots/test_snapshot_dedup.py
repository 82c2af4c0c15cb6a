"""Content-defined chunking deduplicates a memory image that changed in a few places."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from snapshots import SnapshotStore
from tests.snapshots.conftest import make_meta

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
