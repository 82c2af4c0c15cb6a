"""The harness's log, read from a sandbox's writable layer or from a snapshot's.

The log lives in the layer (`HARNESS_LOG`), owned by the harness: it may be a symlink, a fifo
or a sparse file of terabytes. Reads never follow a link and never go past the window asked for.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import BinaryIO

from sandbox_agent.host import confined
from sandbox_agent.runtime.backend import HARNESS_LOG

MAX_LOG_READ = 4 << 20
"""The most one log read returns; a reader pages on with the offset."""


def window(size: int, tail_bytes: int, offset: int | None) -> tuple[int, int]:
    """Where a log read of a `size`-byte log starts and how much it reads: its last `tail_bytes`,
    or from `offset` on, at most MAX_LOG_READ either way."""
    if offset is None:
        return max(0, size - tail_bytes), max(0, min(tail_bytes, MAX_LOG_READ))
    return min(max(0, offset), size), MAX_LOG_READ


def read(root: Path, tail_bytes: int, offset: int | None) -> tuple[bytes, int]:
    """The window of the log in the tree `root` (a sandbox's upper dir), and the log's size."""
    _, size = confined.read(root, HARNESS_LOG, limit=0)
    return confined.read(root, HARNESS_LOG, *window(size, tail_bytes, offset))


def read_archived(layer: BinaryIO, tail_bytes: int, offset: int | None) -> tuple[bytes, int]:
    """The window of the log in a checkpoint's layer archive, and the log's size; none if the
    layer holds no regular file there.

    Of the archive, only the headers up to the log's (the state dir is archived first, see
    `overlay.export_layer`) and the window are read, so a page of a snapshot's log fetches only
    the chunks under them, however large the layer is."""
    with tarfile.open(fileobj=layer, mode="r:") as tar:
        member = next((m for m in tar if m.name.removeprefix("./") == HARNESS_LOG.lstrip("/")), None)
        if member is None or not member.isreg():
            return b"", 0
        # Only the window asked for: the harness may have made its log a sparse file of
        # terabytes, which the layer holds in a few bytes.
        source = tar.extractfile(member)
        assert source is not None
        start, limit = window(member.size, tail_bytes, offset)
        source.seek(start)
        return source.read(limit), member.size
