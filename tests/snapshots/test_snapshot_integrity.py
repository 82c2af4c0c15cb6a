"""Verification finds every damaged chunk; fetch refuses them; a killed writer, or a chunk thread
that fails, leaves nothing visible."""

from __future__ import annotations

import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from snapshots import (
    ChunkingSettings,
    ManifestMismatch,
    RetentionPolicy,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotStore,
    _uploads,
)
from snapshots._chunking import ChunkCodec
from tests.snapshots.conftest import (
    REPO,
    as_v2,
    damage,
    fast_settings,
    forge_manifest,
    make_meta,
    make_tree,
    replace_manifest,
    tree_listing,
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_flipped_byte_fails_verify_and_fetch_naming_snapshot_file_chunk(
    local_store: SnapshotStore, scratch: Path, position: str
) -> None:
    tree = make_tree(scratch / "tree", os.urandom(2 << 20))
    manifest = local_store.put(tree, make_meta("snap-1"))
    local_store.put(make_tree(scratch / "other"), make_meta("snap-2", seq=2, parent_id="snap-1"))
    pages = next(e for e in manifest.files() if e.path == "criu/pages-1.img")
    ref = {
        "first": pages.chunks[0],
        "middle": pages.chunks[len(pages.chunks) // 2],
        "last": pages.chunks[-1],
    }[position]
    damage(scratch / "store", ref)

    report = local_store.verify("snap-1")
    assert not report.ok
    assert [(p.snapshot_id, p.path, p.chunk) for p in report.problems] == [
        ("snap-1", "criu/pages-1.img", ref.hash)
    ]
    # A flip in a compressed frame's header can change the length it declares.
    assert report.problems[0].kind in {"hash-mismatch", "undecodable-chunk", "length-mismatch"}

    with pytest.raises(SnapshotCorrupt) as caught:
        local_store.fetch("snap-1", scratch / "out")
    assert (caught.value.snapshot_id, caught.value.path, caught.value.chunk) == (
        "snap-1",
        "criu/pages-1.img",
        ref.hash,
    )
    assert (
        "snap-1" in str(caught.value)
        and ref.hash in str(caught.value)
        and "criu/pages-1.img" in str(caught.value)
    )
    assert not (scratch / "out").exists(), "a failed fetch leaves no partial tree"
    assert not [p for p in scratch.iterdir() if p.name.startswith(".out.")]


@pytest.mark.timeout(60)
def test_verify_reports_every_problem(local_store: SnapshotStore, scratch: Path) -> None:
    tree = make_tree(scratch / "tree", os.urandom(1 << 20))
    manifest = local_store.put(tree, make_meta("snap-1"))
    local_store.put(make_tree(scratch / "tree2"), make_meta("snap-2", seq=2, parent_id="snap-1"))
    refs = sorted((r for e in manifest.files() for r in e.chunks), key=lambda r: r.offset)
    last, swapped_ref, impostor = refs[-1], refs[0], refs[1].hash
    missing, swapped = last.hash, swapped_ref.hash
    # The pack ends before its last chunk, as if a copy had been cut short.
    os.truncate(scratch / "store" / "packs" / f"{last.pack}.pack", last.offset)
    # A valid zstd frame of other content of the same length: only the hash can catch this.
    import zstandard

    damage(
        scratch / "store", swapped_ref, zstandard.ZstdCompressor().compress(os.urandom(swapped_ref.length))
    )
    (scratch / "store" / "snapshots" / "snap-2.json").write_text("{not json")

    report = local_store.verify()
    kinds = {(p.kind, p.snapshot_id, p.chunk) for p in report.problems}
    assert ("missing-chunk", "snap-1", missing) in kinds
    assert ("hash-mismatch", "snap-1", swapped) in kinds
    assert ("unreadable-manifest", "snap-2", None) in kinds
    assert impostor not in {p.chunk for p in report.problems}
    assert set(report.snapshots_checked) == {"snap-1", "snap-2"}


_WRITER = """
import sys
from snapshots import SnapshotStore
from tests.snapshots.conftest import fast_settings, make_meta
store = SnapshotStore(fast_settings(sys.argv[1], io_threads=1))
store.put(sys.argv[2], make_meta("doomed"))
print("finished", flush=True)
"""


@pytest.mark.timeout(90)
def test_writer_killed_mid_put_leaves_no_visible_snapshot(scratch: Path) -> None:
    url = f"file://{scratch}/store"
    tree = make_tree(scratch / "tree", os.urandom(48 << 20))
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, url, str(tree)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
    )
    packs = scratch / "store" / "packs"
    deadline = time.monotonic() + 30
    while sum(p.stat().st_size for p in packs.glob("*") if p.is_file()) < 4 << 20:
        assert writer.poll() is None, "writer finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    writer.send_signal(signal.SIGKILL)
    output, _ = writer.communicate()
    assert writer.returncode == -signal.SIGKILL and b"finished" not in output

    with SnapshotStore(fast_settings(url)) as store:
        assert not store.exists("doomed")
        with pytest.raises(SnapshotNotFound):
            store.manifest("doomed")
        assert store.history("ep-1") == []
        assert store.verify().ok
        # The dead writer's lock is recognised as dead (same host), so GC runs and clears the debris.
        report = store.gc(RetentionPolicy(keep_last=1))
        assert report.removed_markers == 1 and report.removed_locks == 1
        assert not [p for p in packs.iterdir() if not p.name.startswith(".tmp.")], "no pack of it stays"
        # The id is still free for the retried checkpoint.
        store.put(tree, make_meta("doomed"))
        assert store.verify().ok


def _stored_pages(store_dir: Path, snapshot_id: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The stored manifest's path and document, and its pages file's entry."""
    path = store_dir / "snapshots" / f"{snapshot_id}.json"
    doc = json.loads(path.read_bytes())
    pages = next(e for e in doc["entries"] if e["path"] == "criu/pages-1.img")
    return path, doc, pages


@pytest.mark.timeout(60)
def test_a_manifest_written_as_v2_reads_as_the_same_snapshot(
    local_store: SnapshotStore, scratch: Path
) -> None:
    tree = make_tree(scratch / "tree", os.urandom(2 << 20))
    written = local_store.put(tree, make_meta("snap-1"))
    path, doc, _ = _stored_pages(scratch / "store", "snap-1")
    as_v2(doc)
    path.write_text(json.dumps(doc))
    assert local_store.manifest("snap-1") == written
    local_store.fetch("snap-1", scratch / "fetched")
    assert (scratch / "fetched" / "criu" / "pages-1.img").read_bytes() == (
        tree / "criu" / "pages-1.img"
    ).read_bytes()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda c: [*c[:3], "../../etc", c[4]], "bad chunk location"),
        (lambda c: [*c[:4], -1], "bad chunk location"),
        (lambda c: [*c[:4], "12"], "bad chunk location"),
        (lambda c: ["G" * 64, *c[1:]], "bad chunk reference"),
        (lambda c: [c[0], 0, *c[2:]], "bad chunk reference"),
        (lambda c: [c[0], True, *c[2:]], "bad chunk reference"),
        (lambda c: c[:4], "bad chunk reference"),
    ],
)
def test_a_v2_manifest_with_an_edited_chunk_reference_is_refused(
    local_store: SnapshotStore, scratch: Path, edit: Callable[[list[Any]], list[Any]], problem: str
) -> None:
    """Each chunk is checked, also one in a pack whose id an earlier chunk had already shown
    good: the last chunk of the pages file is edited, after many of the same pack."""
    local_store.put(make_tree(scratch / "tree", os.urandom(2 << 20)), make_meta("snap-1"))
    path, doc, pages = _stored_pages(scratch / "store", "snap-1")
    as_v2(doc)
    assert len(pages["chunks"]) > 2 and len({c[3] for c in pages["chunks"]}) == 1
    pages["chunks"][-1] = edit(pages["chunks"][-1])
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotCorrupt, match=f"unreadable manifest: .*{problem}"):
        local_store.manifest("snap-1")


def _set(column: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(table: dict[str, Any]) -> None:
        table[column][-1] = value

    return edit


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_set("packs", "../../etc"), "bad pack list"),
        (_set("offsets", -1), "out of range"),
        (_set("offsets", "12"), "other than integers"),
        (_set("lengths", 0), "out of range"),
        (_set("lengths", True), "other than integers"),
        (_set("stored_lengths", 1.5), "other than integers"),
        (_set("pack", 1), "names pack 1 of 1"),
        (_set("pack", -1), "out of range"),
        (lambda t: t.update(hashes="G" * 64 + t["hashes"][64:]), "lowercase hex"),
        (lambda t: t.update(hashes=t["hashes"][:-64]), "lowercase hex"),
        (lambda t: t["offsets"].pop(), "differ in length"),
        (lambda t: t.update(lengths=dict(enumerate(t["lengths"]))), "other than integers"),
        # A small manifest must not have a reader allocate gigabytes, or fail unreadably.
        (_set("stored_lengths", 1 << 40), "stored length or offset is out of range"),
        (_set("offsets", 1 << 70), "stored length or offset is out of range"),
        (_set("lengths", 1 << 20), "longer than the chunking's max_size"),
    ],
)
def test_a_manifest_with_an_edited_chunk_column_is_refused(
    local_store: SnapshotStore, scratch: Path, edit: Callable[[dict[str, Any]], None], problem: str
) -> None:
    """A file's chunks are columns (format v3): each column is checked whole."""
    local_store.put(make_tree(scratch / "tree", os.urandom(2 << 20)), make_meta("snap-1"))
    path, doc, pages = _stored_pages(scratch / "store", "snap-1")
    assert len(pages["chunks"]["lengths"]) > 2 and pages["chunks"]["packs"] != []
    edit(pages["chunks"])
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotCorrupt, match=f"unreadable manifest: .*{problem}"):
        local_store.manifest("snap-1")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda text: text.replace('"seq":1', '"seq":Infinity'), "OverflowError"),
        (
            lambda text: text.replace('"parent_id":null', '"parent_id":' + "[" * 100_000 + "]" * 100_000),
            "nests too deep",
        ),
    ],
)
def test_a_manifest_no_reader_can_decode_is_corrupt_and_the_store_still_verifies(
    local_store: SnapshotStore, scratch: Path, edit: Callable[[str], str], problem: str
) -> None:
    local_store.put(make_tree(scratch / "tree"), make_meta("snap-1"))
    local_store.put(make_tree(scratch / "other"), make_meta("snap-2", seq=2))
    path = scratch / "store" / "snapshots" / "snap-1.json"
    edited = edit(path.read_text())
    assert edited != path.read_text()
    path.write_text(edited)
    with pytest.raises(SnapshotCorrupt, match=f"unreadable manifest: .*{problem}"):
        local_store.manifest("snap-1")
    report = local_store.verify()
    assert not report.ok and {p.snapshot_id for p in report.problems} == {"snap-1"}
    assert local_store.verify("snap-2").ok


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["cutting", "compressing"])
def test_a_failure_in_a_chunk_thread_fails_the_put_and_leaves_the_store_as_it_was(
    local_store: SnapshotStore, scratch: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The chunk threads cut files and compress chunks side by side: one that fails stops the
    others, the put raises its error, and no snapshot, pack or temporary file of it stays."""
    local_store.put(make_tree(scratch / "first", os.urandom(4 << 20)), make_meta("s1"))
    packs_before = sorted((scratch / "store" / "packs").iterdir())
    tree = make_tree(scratch / "second", os.urandom(8 << 20))
    if where == "cutting":
        real_cuts = _uploads.cut_points

        def failing_cuts(view: memoryview, settings: ChunkingSettings) -> Iterator[tuple[int, int]]:
            for n, cut in enumerate(real_cuts(view, settings)):
                if n == 40:
                    raise OSError(errno.EIO, "Input/output error")
                yield cut

        monkeypatch.setattr(_uploads, "cut_points", failing_cuts)
    else:
        real_encode = ChunkCodec.encode
        calls = itertools.count()

        def failing_encode(self: ChunkCodec, raw: memoryview | bytes) -> bytes:
            if next(calls) == 40:
                raise OSError(errno.EIO, "Input/output error")
            return real_encode(self, raw)

        monkeypatch.setattr(ChunkCodec, "encode", failing_encode)

    with pytest.raises(OSError, match="Input/output error"):
        local_store.put(tree, make_meta("s2", seq=2, parent_id="s1"))

    assert not local_store.exists("s2")
    assert sorted((scratch / "store" / "packs").iterdir()) == packs_before
    assert local_store.verify().ok
    monkeypatch.undo()
    local_store.put(tree, make_meta("s2", seq=2, parent_id="s1"))
    local_store.fetch("s2", scratch / "out")
    assert tree_listing(scratch / "out") == tree_listing(tree)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("forgery", ["another tree", "not even JSON"])
def test_a_manifest_replaced_after_it_was_recorded_is_refused_before_it_is_parsed(
    local_store: SnapshotStore, scratch: Path, forgery: str
) -> None:
    """Issue 45, F8: a writer with the store's credentials replaces a recorded snapshot's manifest.
    Read with the digest recorded when it was taken, it is refused, naming the snapshot, before
    a byte of it is parsed (the garbage one would otherwise be 'unreadable'); no tree appears."""
    recorded = local_store.put(make_tree(scratch / "tree"), make_meta("snap-1")).digest
    assert recorded == local_store.manifest("snap-1").digest and recorded.startswith("sha256:")
    raw = (
        forge_manifest(local_store, make_tree(scratch / "evil", b"root without seccomp"), "snap-1")
        if forgery == "another tree"
        else b"\xff not a manifest"
    )
    replace_manifest(local_store, "snap-1", raw)

    for read in (
        lambda: local_store.fetch("snap-1", scratch / "out", digest=recorded),
        lambda: local_store.reader("snap-1", recorded).open("checkpoint.json"),
        lambda: local_store.manifest("snap-1", recorded),
    ):
        with pytest.raises(ManifestMismatch) as caught:
            read()
        assert caught.value.snapshot_id == "snap-1" and caught.value.expected == recorded
        assert "snap-1" in str(caught.value) and recorded in str(caught.value)
        assert "replaced" in str(caught.value)
    assert not (scratch / "out").exists()
    assert isinstance(caught.value, SnapshotCorrupt), "nodes report it as a damaged snapshot"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tampered", ["checkpoint.json", "criu/nested/deeper/core-1.img"])
def test_a_file_swapped_by_rewriting_the_manifest_around_it_is_refused(
    local_store: SnapshotStore, scratch: Path, tampered: str
) -> None:
    """Issue 45, F8: every chunk of a tampered checkpoint.json or CRIU image can hash right, if the
    manifest is rewritten to name the forged chunks; the recorded digest refuses that manifest.
    A chunk damaged in place is refused by its own hash, with or without the digest."""
    tree = make_tree(scratch / "tree")
    recorded = local_store.put(tree, make_meta("snap-1")).digest
    evil = make_tree(scratch / "evil")
    (evil / tampered).write_bytes(b'{"oci_spec": {"linux": {"uidMappings": [], "seccomp": null}}}')
    replace_manifest(local_store, "snap-1", forge_manifest(local_store, evil, "snap-1"))
    local_store.fetch("snap-1", scratch / "unchecked")  # what a restore read before the fix
    assert (scratch / "unchecked" / tampered).read_bytes() == (evil / tampered).read_bytes()

    with pytest.raises(ManifestMismatch, match="snap-1"):
        local_store.fetch("snap-1", scratch / "out", digest=recorded)
    assert not (scratch / "out").exists()

    honest = local_store.put(make_tree(scratch / "honest"), make_meta("snap-2", seq=2))
    entry = next(e for e in honest.files() if e.path == "checkpoint.json")
    damage(scratch / "store", entry.chunks[0])
    with pytest.raises(SnapshotCorrupt) as caught:
        local_store.fetch("snap-2", scratch / "out", digest=honest.digest)
    assert (caught.value.snapshot_id, caught.value.path) == ("snap-2", "checkpoint.json")
