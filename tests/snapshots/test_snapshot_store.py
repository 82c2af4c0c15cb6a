"""Round trips, metadata validation and history on the local and S3 backends."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path

import blake3
import pytest
import zstandard

from snapshots import (
    FORMAT,
    ChunkTable,
    InvalidCheckpoint,
    InvalidSnapshotMeta,
    Reason,
    RetentionPolicy,
    SnapshotExists,
    SnapshotNotFound,
    SnapshotStore,
)
from tests.snapshots.conftest import as_v2, make_meta, make_tree, tree_listing


@pytest.mark.timeout(60)
def test_round_trip_preserves_tree(store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    manifest = store.put(tree, make_meta("snap-1"))
    files = [content for kind, _mode, content in tree_listing(tree).values() if kind == "file"]
    assert manifest.sizes.logical_bytes == sum(len(c) for c in files if isinstance(c, bytes))
    assert manifest.reason is Reason.TIME_SLICE
    assert store.exists("snap-1")

    out = scratch / "out"
    store.fetch("snap-1", out)
    assert tree_listing(out) == tree_listing(tree)
    assert (out / "empty-dir").is_dir() and not any((out / "empty-dir").iterdir())

    again = store.manifest("snap-1")
    assert again == manifest
    assert again.trajectory_cursor == {"turn": 1, "branch": "main"}
    assert again.timings_ms["dump"] == 1800.0 and "store_upload" in again.timings_ms


@pytest.mark.timeout(60)
def test_snapshots_are_immutable(store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    store.put(tree, make_meta("snap-1"))
    with pytest.raises(SnapshotExists):
        store.put(tree, make_meta("snap-1"))


@pytest.mark.timeout(30)
def test_missing_snapshot_is_not_found(store: SnapshotStore, scratch: Path) -> None:
    with pytest.raises(SnapshotNotFound):
        store.manifest("nope")
    with pytest.raises(SnapshotNotFound):
        store.fetch("nope", scratch / "out")
    assert not (scratch / "out").exists()


BAD_FIELDS = [
    ("snapshot_id", "../escape"),
    ("episode_id", ""),
    ("seq", -1),
    ("seq", True),
    ("node", "bad node"),
    ("reason", "nap"),
    ("created_at", datetime.datetime(2026, 1, 1)),
    ("image_digest", "sha256:1234"),
    ("runtime_backend", "Runc!"),
    ("criu_version", "latest"),
    ("trajectory_cursor", {"x": object()}),
    ("timings_ms", {"dump": -5}),
    ("parent_id", "no-such-parent"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("field", "value"), BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _v) in enumerate(BAD_FIELDS)]
)
def test_bad_metadata_names_the_field_and_writes_nothing(
    local_store: SnapshotStore, scratch: Path, field: str, value: object
) -> None:
    tree = make_tree(scratch / "tree")
    meta = dataclasses.replace(make_meta("snap-1"), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidSnapshotMeta) as caught:
        local_store.put(tree, meta)
    assert caught.value.field == field
    assert field in str(caught.value)
    store_dir = scratch / "store"
    assert [p for p in store_dir.rglob("*") if p.is_file()] == []


@pytest.mark.timeout(30)
def test_parent_must_be_older_snapshot_of_same_episode(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    local_store.put(tree, make_meta("a", episode_id="ep-1", seq=5))
    with pytest.raises(InvalidSnapshotMeta) as caught:
        local_store.put(tree, make_meta("b", episode_id="ep-2", seq=6, parent_id="a"))
    assert caught.value.field == "parent_id"
    with pytest.raises(InvalidSnapshotMeta) as caught:
        local_store.put(tree, make_meta("c", episode_id="ep-1", seq=5, parent_id="a"))
    assert caught.value.field == "seq"


@pytest.mark.timeout(30)
def test_unsupported_file_type_is_rejected_before_writing(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    os.mkfifo(tree / "criu" / "fifo")
    with pytest.raises(InvalidCheckpoint, match="fifo"):
        local_store.put(tree, make_meta("snap-1"))
    assert not local_store.exists("snap-1")
    assert local_store.episodes() == []


@pytest.mark.timeout(60)
def test_history_lineage_and_sizes(store: SnapshotStore, scratch: Path) -> None:
    memory = os.urandom(1 << 20)
    tree = make_tree(scratch / "tree", memory)
    store.put(tree, make_meta("s1", seq=1))
    store.put(tree, make_meta("s2", seq=2, parent_id="s1"))
    (tree / "criu" / "pages-1.img").write_bytes(memory[:500_000] + os.urandom(100_000) + memory[600_000:])
    store.put(tree, make_meta("s3", seq=3, parent_id="s2"))
    store.put(tree, make_meta("other", episode_id="ep-2", seq=1))

    history = store.history("ep-1")
    assert [h.snapshot_id for h in history] == ["s1", "s2", "s3"]
    assert history[2].lineage == ("s2", "s1") and history[2].lineage_complete
    assert history[0].new_bytes == history[0].stored_bytes > 0
    assert history[1].new_bytes == 0, "an identical snapshot adds nothing"
    assert 0 < history[2].new_bytes < history[0].stored_bytes / 2
    assert history[0].dedup_ratio == history[0].sizes.logical_bytes / history[0].stored_bytes
    assert store.episodes() == ["ep-1", "ep-2"]
    assert [h.snapshot_id for h in store.history("ep-2")] == ["other"]
    assert history[1].new_bytes == 0 and store.history("ep-2")[0].new_bytes == 0, "dedup across episodes"

    store.delete("s2")
    history = store.history("ep-1")
    assert [h.snapshot_id for h in history] == ["s1", "s3"]
    assert history[1].lineage == ("s2",) and not history[1].lineage_complete


@pytest.mark.timeout(30)
def test_manifest_is_versioned_json(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree")
    local_store.put(tree, make_meta("snap-1"))
    doc = json.loads((scratch / "store" / "snapshots" / "snap-1.json").read_bytes())
    assert doc["format"] == FORMAT
    assert doc["episode_id"] == "ep-1" and doc["reason"] == "time-slice" and doc["created_at"].endswith("Z")
    by_path = {e["path"]: e for e in doc["entries"]}
    assert by_path["empty-dir"]["type"] == "dir"
    assert {k: v for k, v in by_path["criu/empty.img"].items() if k != "chunks"} == {
        "path": "criu/empty.img",
        "type": "file",
        "mode": 0o600,
        "size": 0,
    }
    assert by_path["pages-link"]["target"] == "criu/pages-1.img"
    assert by_path["criu/empty.img"]["chunks"]["lengths"] == []
    pages = by_path["criu/pages-1.img"]
    table = pages["chunks"]
    assert sum(table["lengths"]) == pages["size"] == 300_000
    hashes = [table["hashes"][i : i + 64] for i in range(0, len(table["hashes"]), 64)]
    packs = [table["packs"][i] for i in table["pack"]]
    chunks = zip(hashes, table["lengths"], table["stored_lengths"], packs, table["offsets"], strict=True)
    for digest, length, stored, pack, offset in chunks:
        with open(scratch / "store" / "packs" / f"{pack}.pack", "rb") as f:
            f.seek(offset)
            raw = zstandard.ZstdDecompressor().decompress(f.read(stored))
        assert len(raw) == length and blake3.blake3(raw).hexdigest() == digest


@pytest.mark.timeout(30)
def test_snapshots_of_format_v1_still_read(local_store: SnapshotStore, scratch: Path) -> None:
    """One object per chunk, as this store wrote before packs: fetched, verified, and collected."""
    tree = make_tree(scratch / "tree")
    local_store.put(tree, make_meta("snap-1"))
    store_dir = scratch / "store"
    doc = json.loads((store_dir / "snapshots" / "snap-1.json").read_bytes())
    as_v2(doc)
    doc["format"] = "stasis.snapshot/v1"
    for entry in doc["entries"]:
        chunks = []
        for _digest, length, stored, pack, offset in entry.get("chunks", []):
            with open(store_dir / "packs" / f"{pack}.pack", "rb") as f:
                f.seek(offset)
                blob = f.read(stored)
            named = hashlib.sha256(zstandard.ZstdDecompressor().decompress(blob)).hexdigest()  # v1: SHA-256
            (store_dir / "chunks" / named[:2]).mkdir(parents=True, exist_ok=True)
            (store_dir / "chunks" / named[:2] / named).write_bytes(blob)
            chunks.append([named, length, stored])
        if "chunks" in entry:
            entry["chunks"] = chunks
    (store_dir / "snapshots" / "snap-1.json").write_text(json.dumps(doc))
    shutil.rmtree(store_dir / "packs")
    assert local_store.verify().ok
    local_store.fetch("snap-1", scratch / "out")
    assert (scratch / "out" / "criu" / "pages-1.img").read_bytes() == (
        tree / "criu" / "pages-1.img"
    ).read_bytes()
    local_store.delete("snap-1")
    local_store.gc(RetentionPolicy(keep_last=1))
    assert not [p for p in (store_dir / "chunks").rglob("*") if p.is_file()]


@pytest.mark.timeout(30)
def test_a_manifest_reads_back_as_written_and_its_chunk_table_indexes_like_a_tuple(
    local_store: SnapshotStore, scratch: Path
) -> None:
    written = local_store.put(make_tree(scratch / "tree", os.urandom(1 << 20)), make_meta("snap-1"))
    read = local_store.manifest("snap-1")
    assert read == written
    pages = next(e for e in read.files() if e.path == "criu/pages-1.img")
    listed = tuple(next(e for e in written.files() if e.path == "criu/pages-1.img").chunks)
    assert isinstance(pages.chunks, ChunkTable) and len(listed) > 4
    assert tuple(pages.chunks) == listed and hash(pages.chunks) == hash(listed)
    assert [pages.chunks[i] for i in (0, 3, -1, -len(listed))] == [
        listed[i] for i in (0, 3, -1, -len(listed))
    ]
    assert pages.chunks[1:-1:2] == listed[1:-1:2] and pages.chunks[5:2] == ()
    assert list(pages.chunks.lengths) == [c.length for c in listed]
    for index in (len(listed), -len(listed) - 1):
        with pytest.raises(IndexError):
            pages.chunks[index]
