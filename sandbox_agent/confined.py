"""Reading files of a tree the harness or an image controls, as host root, without following a
symlink anywhere on the path (one could point at the node's own files) and never past a bound."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read(root: Path, relative: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, int]:
    """Up to `limit` bytes of root/relative from `offset`, and the file's size. A path that is
    missing, crosses a symlink or is not a regular file reads as empty, size 0."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return b"", 0
        raise
    try:
        parts = relative.strip("/").split("/")
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        with os.fdopen(file_fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return b"", 0
            f.seek(min(max(0, offset), st.st_size))
            return f.read(max(0, limit)), st.st_size
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return b"", 0
        raise
    finally:
        os.close(fd)
