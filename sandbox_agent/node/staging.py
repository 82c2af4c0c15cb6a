"""Where a restore puts the snapshot files it fetches, and which snapshots it will fetch at all."""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from sandbox_agent import checkpoint as ckpt
from sandbox_agent.settings import MEMORY_STAGING_MAX_BYTES
from snapshots import EntryKind, Manifest, SnapshotCorrupt

log = logging.getLogger(__name__)

PAGES = re.compile(rf"{ckpt.CRIU_DIR}/pages-\d+\.img")
"""The CRIU images that hold memory, which a lazy restore leaves in the store."""

MAX_METADATA_BYTES = 64 << 20
"""A checkpoint's metadata is its spec and inventory: a few KiB, up to the spec's 16 MiB of files."""


def private_dir(base: Path | None, name: str) -> Path | None:
    """<base>/<name>, made if missing, when it is a directory only this process's user may enter
    (base may be a world-writable tmpfs such as /dev/shm); else None, with a warning."""
    if base is None:
        return None
    path = base / name
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        log.warning("not staging restores in %s: %s", path, exc)
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        log.warning("not staging restores in %s: not a directory of this user's alone", path)
        return None
    return path


def staged_bytes(manifest: Manifest, leave_out: Callable[[str], object]) -> int:
    """What a restore that leaves out the files `leave_out` names stages of the snapshot."""
    return sum(e.size for e in manifest.entries if e.kind is EntryKind.FILE and not leave_out(e.path))


def staging_for(
    manifest: Manifest, leave_out: Callable[[str], object], disk: Path, memory: Path | None
) -> Path:
    """Where a restore puts the snapshot's files that it fetches: in `memory` (the node's private
    directory in `AgentSettings.memory_dir`) if they are few, else on `disk`."""
    if memory is None:
        return disk
    size = staged_bytes(manifest, leave_out)
    if size > MEMORY_STAGING_MAX_BYTES or 2 * size > shutil.disk_usage(memory).free:
        return disk
    return memory


def checkpoint_shaped(manifest: Manifest) -> None:
    """Refuse a snapshot no node could have written: a node stores directories and regular files
    only, and a restore, run as root, must not follow a symlink out to the node's own files
    (chmod the images, unpack the layer); nor read a metadata file beyond any spec's size."""
    for e in manifest.entries:
        if e.kind is EntryKind.SYMLINK:
            raise SnapshotCorrupt(
                manifest.snapshot_id,
                e.path,
                None,
                "is a symlink; a checkpoint holds only directories and files",
            )
        if e.path == ckpt.METADATA and e.size > MAX_METADATA_BYTES:
            raise SnapshotCorrupt(
                manifest.snapshot_id, e.path, None, f"holds {e.size} bytes; the limit is {MAX_METADATA_BYTES}"
            )
