"""Reading and writing files of a tree the harness or an image controls, as host root, without
following a symlink anywhere on the path (one could point at the node's own files), and reading
never past a bound."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


class Escapes(Exception):
    """A directory on the path is a symlink or not a directory."""


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


@contextmanager
def directory(root: Path, parts: list[str], make: bool = False) -> Iterator[int]:
    """A descriptor of root/parts..., reached one component at a time without following a
    symlink (`make` creates missing ones, 0755); one that is a symlink or not a directory raises
    `Escapes`."""
    fd = os.open(root, _DIR)
    try:
        for depth, part in enumerate(parts, 1):
            if make:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                next_fd = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Escapes(f"/{'/'.join(parts[:depth])} is not a directory") from None
                raise
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def read(root: Path, relative: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, int]:
    """Up to `limit` bytes of root/relative from `offset`, and the file's size. A path that is
    missing, crosses a symlink or is not a regular file reads as empty, size 0."""
    parts = relative.strip("/").split("/")
    try:
        with directory(root, parts[:-1]) as fd:
            # Looked at before it is opened: opening a socket fails (ENXIO), a fifo may block.
            path_fd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            try:
                if not stat.S_ISREG(os.fstat(path_fd).st_mode):
                    return b"", 0
                file_fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY)
            finally:
                os.close(path_fd)
            with os.fdopen(file_fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(min(max(0, offset), size))
                return f.read(max(0, limit)), size
    except Escapes:
        return b"", 0
    except OSError as exc:
        if exc.errno in _GONE:
            return b"", 0
        raise


def write(
    root: Path, relative: str, content: bytes, mode: int = 0o644, owner: tuple[int, int] | None = None
) -> None:
    """Write root/relative as a new regular file with exactly `mode` (and `owner`'s uid and gid,
    if given), making missing directories (0755). Whatever is at the last component (a symlink,
    a fifo, a file) is replaced, never followed; a directory on the path that is a symlink
    raises `Escapes`."""
    parts = relative.strip("/").split("/")
    with directory(root, parts[:-1], make=True) as fd:
        try:
            os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise Escapes(f"{relative} is a directory") from None
        file_fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
        with os.fdopen(file_fd, "wb") as f:
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode)  # not as the umask left it
            f.write(content)
