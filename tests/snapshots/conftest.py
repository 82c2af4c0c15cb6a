"""Fixtures for the snapshots tests: scratch dirs on the real disk, checkpoint trees, a moto S3 server."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapshots import ChunkRef, LockSettings, RetrySettings, SnapshotMeta, SnapshotStore, StoreSettings
from snapshots._layout import manifest_key
from tests.s3server import MotoServer

REPO = Path(__file__).resolve().parents[2]
# trusted.* xattrs and device nodes need a real filesystem; tmpfs may refuse them.
SCRATCH_PARENT = Path("/var/tmp")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory on the real disk, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="stasis-snapshots-test-", dir=SCRATCH_PARENT))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_meta(
    snapshot_id: str, episode_id: str = "ep-1", seq: int = 1, parent_id: str | None = None
) -> SnapshotMeta:
    """Valid metadata for a test snapshot."""
    return SnapshotMeta(
        snapshot_id=snapshot_id,
        episode_id=episode_id,
        seq=seq,
        parent_id=parent_id,
        node="node-a",
        reason="time-slice",
        created_at=datetime.datetime(2026, 5, 1, 12, 0, seq % 60, tzinfo=datetime.UTC),
        image_digest="sha256:" + "ab" * 32,
        runtime_backend="runc",
        criu_version="4.2.1",
        trajectory_cursor={"turn": seq, "branch": "main"},
        timings_ms={"dump": 1800.0},
    )


def make_tree(root: Path, memory: bytes = b"") -> Path:
    """A checkpoint-shaped tree with files, nested and empty dirs, an empty file, modes and a symlink."""
    (root / "criu" / "nested" / "deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "checkpoint.json").write_text('{"sandbox_id": "sb-1"}')
    (root / "criu" / "pages-1.img").write_bytes(memory or os.urandom(300_000))
    (root / "criu" / "empty.img").write_bytes(b"")
    (root / "criu" / "nested" / "deeper" / "core-1.img").write_bytes(b"core" * 5000)
    os.chmod(root / "criu" / "empty.img", 0o600)
    os.chmod(root / "criu" / "nested", 0o750)
    os.chmod(root / "checkpoint.json", 0o640)
    (root / "criu" / "exec.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "criu" / "exec.sh", 0o755)
    os.symlink("criu/pages-1.img", root / "pages-link")
    return root


def tree_listing(root: Path) -> dict[str, tuple[str, int, bytes | str | None]]:
    """Kind, permission bits and content (or link target) of every entry under root."""
    out: dict[str, tuple[str, int, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        st = path.lstat()
        if path.is_symlink():
            out[rel] = ("symlink", 0, os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", st.st_mode & 0o7777, None)
        else:
            out[rel] = ("file", st.st_mode & 0o7777, path.read_bytes())
    return out


def fast_settings(url: str, **overrides: object) -> StoreSettings:
    """Settings with short retry and lock timings so failure paths finish quickly in tests."""
    base = {
        "url": url,
        "retry": RetrySettings(attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2),
        "locks": LockSettings(
            stale_after_s=30, refresh_interval_s=1, acquire_timeout_s=30, gc_acquire_timeout_s=5
        ),
    }
    base.update(overrides)
    return StoreSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def local_store(scratch: Path) -> Iterator[SnapshotStore]:
    """A store in a local directory."""
    with SnapshotStore(fast_settings(f"file://{scratch}/store")) as store:
        yield store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> SnapshotStore:
    """A local store, then one in S3."""
    store: SnapshotStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture
def s3_store(moto_server: MotoServer, request: pytest.FixtureRequest) -> Iterator[SnapshotStore]:
    """A store in a fresh bucket of the moto server."""
    bucket = "stasis-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    moto_server.create_bucket(bucket)
    with SnapshotStore(fast_settings(f"s3://{bucket}/snaps?endpoint={moto_server.endpoint}")) as store:
        yield store


def stored_chunks(store_dir: Path) -> set[tuple[str, str]]:
    """(pack, hash) of every chunk the store holds: in packs by their indexes (delta chunks
    too), and ("", hash) of objects of their own (snapshots of format v1)."""
    held = {
        (p.name.removesuffix(".idx"), row[0])
        for p in (store_dir / "packs").glob("*.idx")
        for doc in [json.loads(p.read_bytes())]
        for row in doc["chunks"] + doc.get("deltas", [])
    }
    return held | {
        ("", p.name)
        for p in (store_dir / "chunks").rglob("*")
        if p.is_file() and not p.name.startswith(".tmp.")
    }


def damage(store_dir: Path, ref: ChunkRef, replacement: bytes | None = None) -> None:
    """Flip a byte in the middle of a stored chunk, or write `replacement` (of its stored length) over it."""
    with open(store_dir / "packs" / f"{ref.pack}.pack", "r+b") as f:
        f.seek(ref.offset)
        blob = bytearray(f.read(ref.stored_length))
        if replacement is None:
            blob[len(blob) // 2] ^= 0x01
        else:
            assert len(replacement) == ref.stored_length
            blob = bytearray(replacement)
        f.seek(ref.offset)
        f.write(bytes(blob))


def forge_manifest(store: SnapshotStore, tree: Path, snapshot_id: str) -> bytes:
    """What a writer with the store's credentials puts in place of `snapshot_id`'s manifest: that
    of a tree of its own, stored beside it (every chunk sound), renamed to be that snapshot."""
    real = store.manifest(snapshot_id)
    forged_id = f"forged-{snapshot_id}"
    store.put(tree, make_meta(forged_id, episode_id=real.episode_id, seq=real.seq))
    # Test seam: the store's own objects, as any holder of its credentials reads and writes them.
    doc = json.loads(store._backend.get(manifest_key(forged_id)))
    doc["snapshot_id"], doc["parent_id"] = snapshot_id, real.parent_id
    return json.dumps(doc, separators=(",", ":")).encode()


def replace_manifest(store: SnapshotStore, snapshot_id: str, raw: bytes) -> None:
    """Overwrite a snapshot's manifest in the store, as a writer with its credentials can."""
    store._backend.put(manifest_key(snapshot_id), raw)  # Test seam: as `forge_manifest`.


def as_v2(doc: dict[str, Any]) -> None:
    """Rewrite a manifest as format v2 wrote it: one list per chunk."""
    doc["format"] = "stasis.snapshot/v2"
    for entry in doc["entries"]:
        if entry["type"] == "file":
            t = entry["chunks"]
            hashes = [t["hashes"][i : i + 64] for i in range(0, len(t["hashes"]), 64)]
            packs = [t["packs"][i] for i in t["pack"]]
            entry["chunks"] = [
                list(c)
                for c in zip(hashes, t["lengths"], t["stored_lengths"], packs, t["offsets"], strict=True)
            ]
