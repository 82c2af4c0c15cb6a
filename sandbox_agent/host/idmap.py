"""User namespaces: a sandbox's uid 0 is an unprivileged host id, and its trees are id-mapped.

A sandbox's ids 0..65535 are host ids `base`..`base`+65535, the same on every node (CRIU's images
carry the map, and a restored sandbox must see the ids it froze with). Files stay on disk as the
sandbox sees them (root's files are owned by 0), so images, layers and snapshots are the same with
or without a user namespace. The sandbox sees them through id-mapped mounts: its image tree and
its writable layer are each mounted again with host id n shown as `base`+n, and its overlay root
is built from those views by a mounter acting as the sandbox's root, so that copy-ups and new
files land on disk with the sandbox's own ids.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.host import tools
from sandbox_agent.host._libc import check, libc

log = logging.getLogger(__name__)

SIZE = 65536
"""Ids a sandbox has: 0..65535, as in a Linux system's own range of users and groups."""

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same on x86_64 and arm64
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
_PR_GET_SECUREBITS, _PR_SET_SECUREBITS = 27, 28
_SECBIT_NO_SETUID_FIXUP = 1 << 2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class IdMap:
    """Sandbox ids 0..SIZE-1 as host ids base..base+SIZE-1; one per node, shared by its sandboxes."""

    def __init__(self, base: int) -> None:
        if base <= 0 or base + SIZE > 1 << 32:
            raise ValueError(f"a user namespace's first host id must be in 1..{(1 << 32) - SIZE}")
        self.base = base
        self._userns: int | None = None
        self._lock = threading.Lock()

    def oci(self) -> dict[str, list[dict[str, int]]]:
        """The OCI `linux` entries for this map."""
        mapping = [{"containerID": 0, "hostID": self.base, "size": SIZE}]
        return {"uidMappings": mapping, "gidMappings": mapping}

    def warm(self) -> None:
        """Make the user namespace now, ahead of the first id-mapped mount; if it cannot be made,
        say so (that mount then fails with the same reason)."""
        try:
            self._userns_fd()
        except FailedPrecondition as exc:
            log.warning("the id map from host id %d is not ready: %s", self.base, exc)

    def _userns_fd(self) -> int:
        """A user namespace with this map, held by a descriptor: what id-mapped mounts refer to."""
        with self._lock:
            if self._userns is None:
                self._userns = self._new_userns()
        return self._userns

    def _new_userns(self) -> int:
        with tools.held(["unshare", "--user", "sleep", "60"], what="user namespace holder") as holder:
            own = os.readlink("/proc/self/ns/user")
            deadline = time.monotonic() + 10
            while os.readlink(f"/proc/{holder.pid}/ns/user") == own:
                if holder.poll() is not None or time.monotonic() > deadline:
                    raise FailedPrecondition("could not make a user namespace for id-mapped mounts")
                time.sleep(0.002)
            for name in ("uid_map", "gid_map"):
                Path(f"/proc/{holder.pid}/{name}").write_text(f"0 {self.base} {SIZE}\n")
            return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)

    def mount_view(self, source: Path, target: Path) -> None:
        """Mount `source` again at `target` with this map: host id n shows as base+n."""
        target.mkdir(parents=True, exist_ok=True)
        what = f"id-mapping {source} at {target}"
        tree = check(
            libc.syscall(
                _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC
            ),
            what,
        )
        try:
            attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, self._userns_fd())
            check(
                libc.syscall(
                    _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
                ),
                f"{what} (the filesystem of {source} may not support id-mapped mounts)",
            )
            check(
                libc.syscall(
                    _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH
                ),
                what,
            )
        finally:
            os.close(tree)

    @contextmanager
    def acting_as_root(self) -> Iterator[None]:
        """Let this thread act on files as the sandbox's root (fsuid and fsgid `base`), keeping its
        capabilities: an overlay mounted so keeps those ids for its copy-ups and new files. Ids are
        per thread, so the agent's other threads are untouched."""
        before = check(libc.prctl(_PR_GET_SECUREBITS, 0, 0, 0, 0), "reading securebits")
        check(libc.prctl(_PR_SET_SECUREBITS, before | _SECBIT_NO_SETUID_FIXUP, 0, 0, 0), "setting securebits")
        libc.setfsgid(self.base)
        libc.setfsuid(self.base)
        try:
            yield
        finally:
            libc.setfsuid(0)
            libc.setfsgid(0)
            libc.prctl(_PR_SET_SECUREBITS, before, 0, 0, 0)

    def mount_overlay(self, lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
        """An overlay of id-mapped views, mounted as the sandbox's root (see `acting_as_root`)."""
        target.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
        with self.acting_as_root():
            check(
                libc.mount(b"overlay", os.fsencode(target), b"overlay", 0, options.encode()),
                f"mounting the sandbox's overlay at {target}",
            )
