"""The node's cache of read-only image root filesystems, keyed by content digest."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_agent.errors import InvalidSpec, NotFound
from sandbox_agent.host import tools
from sandbox_agent.images import oci
from sandbox_agent.images.oci import ImageConfig, RegistryAccess

DIGEST_PREFIX = "sha256:"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Image:
    digest: str
    rootfs: Path
    names: tuple[str, ...]
    size_bytes: int
    config: ImageConfig = field(default_factory=ImageConfig)
    """Entrypoint, Cmd, Env, WorkingDir and User; empty for an image imported as a bare tree."""


def tree_digest(root: Path) -> tuple[str, int]:
    """Digest a rootfs tree by what a process inside can observe, never by mtime or source format.

    Every entry, in sorted path order, contributes its path, type, permission bits, owner,
    and its content (file bytes, link target or device number) plus its xattrs. Two nodes that
    import the same image from a tarball, a directory or Docker therefore agree on the digest.
    """
    h = hashlib.sha256()
    total = 0
    for rel, st in _walk_sorted(root):
        path = root / rel if rel else root
        mode = st.st_mode
        h.update(os.fsencode(rel) + b"\0")
        h.update(f"{stat.S_IFMT(mode) >> 12:o} {stat.S_IMODE(mode):o} {st.st_uid} {st.st_gid}\0".encode())
        if stat.S_ISREG(mode):
            total += st.st_size
            fh = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(_CHUNK):
                    fh.update(block)
            h.update(fh.digest())
        elif stat.S_ISLNK(mode):
            h.update(os.fsencode(os.readlink(path)))
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            h.update(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}".encode())
        for name in sorted(os.listxattr(path, follow_symlinks=False)):
            h.update(b"\0x" + name.encode() + b"=" + os.getxattr(path, name, follow_symlinks=False))
        h.update(b"\n")
    return DIGEST_PREFIX + h.hexdigest(), total


def _walk_sorted(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    stack = [""]
    while stack:
        rel = stack.pop()
        st = os.lstat(root / rel if rel else root)
        yield rel, st
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(root / rel if rel else root), reverse=True)
            stack.extend(f"{rel}/{n}" if rel else n for n in names)


class ImageCache:
    """Image rootfs trees under `<node root>/images/<hex>/rootfs`, never written after import."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        # An image is untrusted and may hold setuid-root files: no other user of the node reaches
        # them (sandboxes see them through their own mounts).
        self.root.chmod(0o700)
        self._names_file = self.root / "names.json"
        self._thread_lock = threading.RLock()
        self._depth = 0

    @contextmanager
    def importing(self) -> Iterator[None]:
        """Hold the cache for a check-then-import. Agents of several nodes on one machine may
        share a cache, so a file lock orders them as well as the threads of one agent."""
        with self._thread_lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            with open(self.root / ".lock", "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                self._depth = 1
                try:
                    yield
                finally:
                    self._depth = 0
                    fcntl.flock(f, fcntl.LOCK_UN)

    def _names(self) -> dict[str, str]:
        try:
            names: dict[str, str] = json.loads(self._names_file.read_text())
            return names
        except FileNotFoundError:
            return {}

    def _write_names(self, names: dict[str, str]) -> None:
        tmp = self._names_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(names, indent=1, sort_keys=True))
        os.replace(tmp, self._names_file)

    def _dir(self, digest: str) -> Path:
        return self.root / digest.removeprefix(DIGEST_PREFIX)

    def list(self) -> list[Image]:
        names = self._names()
        images = []
        for meta in sorted(self.root.glob("*/image.json")):
            info = json.loads(meta.read_text())
            digest = info["digest"]
            images.append(
                Image(
                    digest=digest,
                    rootfs=meta.parent / "rootfs",
                    names=tuple(sorted(n for n, d in names.items() if d == digest)),
                    size_bytes=info["size_bytes"],
                    config=ImageConfig.from_json(info.get("config") or {}),
                )
            )
        return images

    def resolve(self, ref: str) -> Image:
        """Find an image by name or digest; NotFound lists what this node has."""
        if not ref:
            raise InvalidSpec("image", "must name an image (a name such as 'base', or sha256:<hex>)")
        digest = ref if ref.startswith(DIGEST_PREFIX) else self._names().get(ref)
        if digest is not None and (self._dir(digest) / "image.json").exists():
            return next(i for i in self.list() if i.digest == digest)
        known = ", ".join(f"{','.join(i.names) or '-'} ({i.digest})" for i in self.list()) or "none"
        raise NotFound(f"image {ref!r} is not in this node's image cache; cached images: {known}")

    def has(self, digest: str) -> bool:
        return (self._dir(digest) / "image.json").exists()

    def import_tarball(self, tarball: Path, name: str = "") -> Image:
        if not tarball.is_file():
            raise InvalidSpec("tarball", f"{tarball} is not a file")
        return self._import(lambda dest: _extract(tarball, dest), name, source=str(tarball))

    def import_directory(self, directory: Path, name: str = "") -> Image:
        if not directory.is_dir():
            raise InvalidSpec("directory", f"{directory} is not a directory")
        return self._import(
            lambda dest: tools.run(
                ["cp", "-a", "--", f"{directory}/.", str(dest)], what="copying image directory"
            ),
            name,
            source=str(directory),
        )

    def pull(
        self, ref: str, access: RegistryAccess, name: str = "", progress: oci.Progress | None = None
    ) -> Image:
        """Fetch an image from a registry or an archive (see `oci`) unless it is cached, and
        unpack it. The cache keeps it under `name` and under `ref` itself. `progress` hears
        `waiting` (for another import into this cache), the fetched bytes, then `unpacking`."""
        report = progress or (lambda _: None)
        report(oci.PullProgress("waiting"))
        with self.importing():
            try:
                image = self.resolve(ref)
                if name:
                    self._alias(image.digest, (name,))
                return self.resolve(ref)
            except NotFound:
                pass
            fetched = oci.fetch(ref, self.root / "oci", access, progress)

            def unpack(dest: Path) -> None:
                report(oci.PullProgress("unpacking", fetched.size_bytes, fetched.size_bytes))
                oci.unpack(fetched, dest)

            try:
                return self._import(
                    unpack,
                    name,
                    source=ref,
                    config=fetched.config,
                    aliases=(ref,),
                )
            finally:
                oci.forget(fetched)

    def _alias(self, digest: str, names: tuple[str, ...]) -> None:
        known = self._names()
        known.update({n: digest for n in names if n})
        self._write_names(known)

    def _import(
        self,
        fill: object,
        name: str,
        source: str,
        config: ImageConfig | None = None,
        aliases: tuple[str, ...] = (),
    ) -> Image:
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=self.root))
        try:
            rootfs = staging / "rootfs"
            rootfs.mkdir()
            fill(rootfs)  # type: ignore[operator]
            digest, size = tree_digest(rootfs)
            with self.importing():
                final = self._dir(digest)
                if not (final / "image.json").exists():
                    shutil.rmtree(final, ignore_errors=True)
                    info = {"digest": digest, "size_bytes": size, "source": source}
                    if config is not None:
                        info["config"] = config.to_json()
                    (staging / "image.json").write_text(json.dumps(info))
                    os.rename(staging, final)
                self._alias(digest, (name, *aliases))
            return self.resolve(digest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _extract(tarball: Path, dest: Path) -> None:
    tools.run(
        ["tar", "-xf", str(tarball), "-C", str(dest), "--numeric-owner", "--xattrs", "--xattrs-include=*"],
        what=f"extracting image tarball {tarball}",
    )
