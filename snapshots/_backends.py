"""The small key/object interface the store runs on, the local-directory backend, and URL parsing."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from ._errors import InvalidSettings, StoreRejected, StoreUnavailable
from ._settings import StoreSettings

TEMP_PREFIX = ".tmp."


class ObjectMissing(Exception):
    """The key does not exist (internal; the store turns it into a domain error)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class Backend(Protocol):
    """Flat key/object storage. Keys are '/'-separated relative paths.

    Every put is all-or-nothing: a reader sees the whole object or no object.
    """

    @property
    def location(self) -> str:
        """Human-readable location for error messages."""
        ...

    @property
    def remote(self) -> bool:
        """Whether requests cross a network (so more of them should be in flight)."""
        ...

    def put(self, key: str, blob: bytes, *, durable: bool = True) -> None:
        """Create or replace an object. Not `durable`: it need not outlive a crash of this host
        (a lock, which dies with its holder), only be seen by every other party at once."""
        ...

    def put_if_absent(self, key: str, blob: bytes) -> bool:
        """Durably create an object unless the key exists; False if it existed."""
        ...

    def ensure_exclusive_create(self) -> None:
        """Raise StoreRejected unless `put_if_absent` of an existing key is refused here; tried
        once per backend, before the first write that relies on it."""
        ...

    def get(self, key: str) -> bytes:
        """Read a whole object; raises ObjectMissing."""
        ...

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Read `length` bytes at `offset` of an object (fewer only past its end); raises ObjectMissing."""
        ...

    def writer(self, key: str) -> ObjectWriter:
        """Write a large object piece by piece; it appears, whole, only once committed."""
        ...

    def size(self, key: str) -> int | None:
        """Stored size of an object, or None if it does not exist."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Keys starting with prefix, in no particular order."""
        ...

    def list_written(self, prefix: str) -> Iterator[tuple[str, float]]:
        """Keys starting with prefix, each with the Unix time the store last wrote it, by the
        store's own clock (a file's mtime, an object's LastModified): every party reads the same
        times, however far the clocks of their hosts disagree."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; missing keys are not an error."""
        ...

    def flush(self) -> None:
        """Make every earlier put durable (before a manifest that refers to them is published)."""
        ...

    def discard_partial(self, older_than_s: float) -> int:
        """Remove leftovers of interrupted puts older than the given age; returns how many."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class ObjectWriter(Protocol):
    """An object being written: appended to, then committed (it appears whole) or aborted."""

    def write(self, data: bytes) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


_WRITEBACK_BYTES = 32 << 20
"""A durable object being written is synced every this many bytes, by a helper thread, so that
the sync at its commit finds little left to write: the disk works while the CPUs compress."""


class _LocalWriter:
    """A temporary file beside the object's path, renamed into place on commit."""

    def __init__(self, backend: LocalBackend, key: str) -> None:
        self._backend, self._key = backend, key
        self._path = backend._path(key)
        self._temp = self._path.with_name(f"{TEMP_PREFIX}{self._path.name}.{uuid.uuid4().hex}")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = open(self._temp, "xb")  # noqa: SIM115 - closed by commit or abort
        except OSError as exc:
            raise backend._error(key, exc) from None
        self._unsynced = 0
        self._syncing: threading.Thread | None = None

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            self.abort()
            raise self._backend._error(self._key, exc) from None
        self._unsynced += len(data)
        if self._backend.durable and self._unsynced >= _WRITEBACK_BYTES and not self._sync_running():
            self._file.flush()
            self._unsynced = 0
            self._syncing = threading.Thread(target=os.fdatasync, args=(self._file.fileno(),), daemon=True)
            self._syncing.start()

    def _sync_running(self) -> bool:
        return self._syncing is not None and self._syncing.is_alive()

    def _settle(self) -> None:
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None

    def commit(self) -> None:
        try:
            self._settle()
            if self._backend.durable:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            os.rename(self._temp, self._path)
        except OSError as exc:
            self.abort()
            raise self._backend._error(self._key, exc) from None
        self._backend.renamed_in(self._path.parent)

    def abort(self) -> None:
        self._settle()
        self._file.close()
        self._temp.unlink(missing_ok=True)


def _check_key(key: str) -> None:
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(p in ("", ".", "..") for p in parts[:-1])
        or parts[-1] in (".", "..")
    ):
        raise ValueError(f"bad object key {key!r}")


class LocalBackend:
    """A directory, possibly on a shared filesystem: objects are files made visible by rename(2)."""

    def __init__(self, root: Path, durable: bool) -> None:
        self._root = root
        self.durable = durable
        self._renamed_in: set[Path] = set()
        self._renamed_lock = threading.Lock()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._error(None, exc) from None

    @property
    def location(self) -> str:
        return f"file://{self._root}"

    @property
    def remote(self) -> bool:
        return False

    def _error(self, key: str | None, exc: OSError) -> StoreRejected | StoreUnavailable:
        detail = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return StoreRejected(self.location, key, detail)
        return StoreUnavailable(self.location, key, detail)

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self._root / key

    def _write_temp(self, path: Path, blob: bytes, sync: bool) -> Path:
        temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
        for attempt in (0, 1):
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                break
            except FileNotFoundError:
                # The parent may not exist yet, or GC removed it as empty a moment ago.
                if attempt:
                    raise
                path.parent.mkdir(parents=True, exist_ok=True)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return temp

    def _sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, blob: bytes, *, durable: bool = True) -> None:
        path = self._path(key)
        try:
            temp = self._write_temp(path, blob, sync=self.durable and durable)
            os.rename(temp, path)
        except OSError as exc:
            raise self._error(key, exc) from None
        if durable:
            self.renamed_in(path.parent)

    def put_if_absent(self, key: str, blob: bytes) -> bool:
        path = self._path(key)
        try:
            temp = self._write_temp(path, blob, sync=self.durable)
            try:
                # link(2), unlike rename(2), fails when the target exists: an atomic create-if-absent.
                os.link(temp, path)
            except FileExistsError:
                return False
            finally:
                temp.unlink(missing_ok=True)
            if self.durable:
                self._sync_dir(path.parent)
            return True
        except OSError as exc:
            raise self._error(key, exc) from None

    def ensure_exclusive_create(self) -> None:
        pass  # link(2) refuses an existing name on every filesystem.

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        except OSError as exc:
            raise self._error(key, exc) from None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        except OSError as exc:
            raise self._error(key, exc) from None
        try:
            return os.pread(fd, length, offset)
        except OSError as exc:
            raise self._error(key, exc) from None
        finally:
            os.close(fd)

    def writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self, key)

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(key, exc) from None

    def list(self, prefix: str) -> Iterator[str]:
        head, _, _ = prefix.rpartition("/")
        base = self._root / head if head else self._root
        keys: list[str] = []
        try:
            for dirpath, _dirs, files in os.walk(base):
                rel = os.path.relpath(dirpath, self._root)
                rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
                keys.extend(
                    rel + f for f in files if not f.startswith(TEMP_PREFIX) and (rel + f).startswith(prefix)
                )
        except OSError as exc:
            raise self._error(prefix, exc) from None
        return iter(keys)

    def list_written(self, prefix: str) -> Iterator[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        for key in self.list(prefix):
            try:
                found.append((key, os.stat(self._path(key)).st_mtime))
            except FileNotFoundError:
                continue  # deleted since it was listed
            except OSError as exc:
                raise self._error(key, exc) from None
        return iter(found)

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise self._error(key, exc) from None
            if not key.startswith(("chunks/", "packs/", "locks/")):
                parents.add(path.parent)
        # Per-episode directories would otherwise pile up forever; chunk, pack and lock dirs stay
        # (every put and GC writes and deletes a lock: removing their dir when it empties raced
        # another party's lock write in it, which failed with ENOENT).
        for parent in parents:
            if parent != self._root:
                with contextlib.suppress(OSError):  # Not empty, or already gone.
                    parent.rmdir()

    def renamed_in(self, directory: Path) -> None:
        """A durable object was renamed into this directory: flush() makes the name durable too."""
        if self.durable:
            with self._renamed_lock:
                self._renamed_in.add(directory)

    def flush(self) -> None:
        # Objects written piece by piece (packs, their indexes) were fsynced as they were
        # committed; their names are made durable here, one directory fsync for all of them.
        with self._renamed_lock:
            directories, self._renamed_in = self._renamed_in, set()
        for directory in directories:
            try:
                self._sync_dir(directory)
            except OSError as exc:
                raise self._error(None, exc) from None

    def discard_partial(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _dirs, files in os.walk(self._root):
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    path = os.path.join(dirpath, name)
                    try:
                        if os.stat(path).st_mtime < cutoff:
                            os.unlink(path)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    def close(self) -> None:
        pass


def open_backend(settings: StoreSettings) -> Backend:
    """Build the backend named by settings.url."""
    url = settings.url
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            raise InvalidSettings("url", f"file URL must be file:///absolute/path, got {url!r}")
        path = unquote(parts.path) if parts.scheme == "file" else url
        if not path:
            raise InvalidSettings("url", "empty path")
        return LocalBackend(Path(path).absolute(), settings.durable)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise InvalidSettings("url", f"s3 URL needs a bucket: {url!r}")
        query = parse_qs(parts.query)
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise InvalidSettings("url", f"unknown s3 URL parameters {sorted(unknown)}")
        from ._s3 import S3Backend  # boto3 is heavy; local stores never import it

        return S3Backend(
            bucket=parts.netloc,
            prefix=parts.path.strip("/"),
            endpoint=query.get("endpoint", [None])[-1],
            region=query.get("region", [None])[-1],
            settings=settings,
        )
    raise InvalidSettings("url", f"unsupported scheme {parts.scheme!r} (use file:// or s3://)")
