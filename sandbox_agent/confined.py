"""Reading and writing files of a tree the harness or an image controls, as host root, without
following a symlink anywhere on the path (one could point at the node's own files), and reading
never past a bound."""

from __future__ import annotations

import contextlib
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


class Escapes(Exception):
    """A directory on the path is a symlink or not a directory."""


def write(root: Path, relative: str, content: bytes, mode: int = 0o644) -> None:
    """Write root/relative as a new regular file, making missing directories (0755). Whatever
    is at the last component (a symlink, a fifo, a file) is replaced, never followed; a
    directory on the path that is a symlink raises `Escapes`."""
    parts = relative.strip("/").split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for depth, part in enumerate(parts[:-1], 1):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Escapes(f"/{'/'.join(parts[:depth])} is not a directory") from None
                raise
            os.close(fd)
            fd = next_fd
        try:
            os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise Escapes(f"{relative} is a directory") from None
        file_fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
        with os.fdopen(file_fd, "wb") as f:
            f.write(content)
    finally:
        os.close(fd)
