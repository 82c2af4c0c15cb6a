"""Overlay root filesystems and the writable layer that moves between nodes."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from sandbox_agent.errors import CheckpointCorrupt, FailedPrecondition, InvalidSpec
from sandbox_agent.host import confined, tools
from sandbox_agent.host._libc import check, libc

# These xattrs name the source node's lower filesystem (file handles, fs uuid); a layer
# carrying them confuses overlay on another node, so they never leave the node.
NODE_BOUND_XATTRS = ("trusted.overlay.origin", "trusted.overlay.impure", "trusted.overlay.uuid")

_TAR_COMMON = ("--xattrs", "--xattrs-include=*", "--numeric-owner")

# <linux/loop.h>: struct loop_config is the backing fd, a block size, a struct loop_info64 and
# eight reserved u64s; loop_info64 is five u64s, four u32s (the flags last), the file name, the
# crypt name, the key and two u64s.
_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE, _LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
_LOOP_CONFIG = struct.Struct("=II")
_LOOP_INFO = struct.Struct("=5Q4I64s64s32s2Q")
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH, _UMOUNT_NOFOLLOW = 0x2, 0x8


def mount(lowers: Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount an overlay; the first lower dir is the topmost."""
    for d in (upper, work, target):
        d.mkdir(parents=True, exist_ok=True)
    tools.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}",
            str(target),
        ],
        what=f"mounting overlay at {target}",
    )


def mount_read_only(lowers: Sequence[Path], target: Path) -> None:
    """Mount lower dirs (the first topmost) as one read-only tree: an overlay without an upper."""
    target.mkdir(parents=True, exist_ok=True)
    tools.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"ro,lowerdir={':'.join(str(p) for p in lowers)}", str(target)],
        what=f"mounting a read-only overlay at {target}",
    )  # fmt: skip


def make_layer_fs(image: Path, size_mb: int, inodes: int, *, nice: bool = False) -> None:
    """Make a writable layer's filesystem: an ext4 in a sparse file, so that filling it (bytes or
    inodes) stops at its size and nothing else on the node notices. `nice`: at the lowest CPU
    priority, for work ahead of need."""
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    tools.run(
        [*(["nice", "-n", "19"] if nice else []), "mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(inodes), "-O", "^has_journal",
         "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)],
        what=f"making the writable layer's filesystem in {image}",
    )  # fmt: skip


def mount_layer_disk(image: Path, target: Path) -> None:
    """Loop-mount a layer's filesystem (`make_layer_fs`) at target. Its files lie on disk as the
    sandbox sees them (its root's as uid 0): nosuid and nodev, so that no setuid file or device
    a harness made there means anything to the node.

    It is on the way of every restore: the loop device is set up and the disk mounted by the
    agent's own calls, as `mount -o loop` would (0.5-1 ms, where the `mount` process took
    6 ms). The device detaches itself once the disk is unmounted (autoclear)."""
    target.mkdir(parents=True, exist_ok=True)
    with _loop_device(image) as device:
        check(
            libc.mount(os.fsencode(device), os.fsencode(target), b"ext4", _MS_NOSUID | _MS_NODEV, None),
            f"mounting {image} ({device}) at {target}",
        )


@contextmanager
def _loop_device(image: Path) -> Iterator[str]:
    """A free loop device, attached to `image` with autoclear while this holds it open."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        info = _LOOP_INFO.pack(*[0] * 8, _LO_FLAGS_AUTOCLEAR, os.fsencode(image)[:63], b"", b"", 0, 0)
        config = bytearray(_LOOP_CONFIG.pack(backing, 0) + info + bytes(8 * 8))
        while True:
            device = f"/dev/loop{fcntl.ioctl(control, _LOOP_CTL_GET_FREE)}"
            fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, config)
                break
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EBUSY:  # else taken since it was free: the next one
                    raise FailedPrecondition(f"attaching {image} to {device}: {exc.strerror}") from None
        try:
            yield device
        finally:
            os.close(fd)
    finally:
        os.close(backing)
        os.close(control)


def is_mounted(target: Path) -> bool:
    wanted = os.fsencode(str(target))
    with open("/proc/self/mounts", "rb") as f:
        return any(line.split(b" ")[1] == wanted for line in f)


def unmount(target: Path) -> None:
    """Unmount `target` if something is mounted there, with umount(2): an `umount` process took
    about 3 ms, and a sandbox's teardown unmounts several. umount(2) itself says when nothing is
    mounted there, so the mount table is not read first."""
    _unmount(os.fsencode(str(target)))


def unmount_below(*roots: Path) -> None:
    """Unmount everything mounted at or below any of roots, the last mounted first (an overlay
    before the trees it is made of). The mount table is read once: with many sandboxes on a node
    it has hundreds of lines, and when a drain tore down 64 sandboxes, each of the five calls a
    teardown made, reading it once and again per mount, took 2.2 ms of CPU."""
    prefixes = [os.fsencode(str(root)) for root in roots]
    with open("/proc/self/mounts", "rb") as f:
        targets = [line.split(b" ")[1] for line in f]
    for target in reversed(targets):
        if any(target == prefix or target.startswith(prefix + b"/") for prefix in prefixes):
            _unmount(target)


def _unmount(target: bytes) -> None:
    """Unmount a mount point. One still in use (a process of the sandbox may still be exiting) is
    detached now, and goes once unused; where nothing is mounted (any more: a detached mount above
    may have taken it along), or the path is gone, nothing is done."""
    if libc.umount2(target, _UMOUNT_NOFOLLOW) == 0 or ctypes.get_errno() in (errno.EINVAL, errno.ENOENT):
        return
    check(libc.umount2(target, _UMOUNT_NOFOLLOW | _MNT_DETACH), f"unmounting {os.fsdecode(target)}")


def export_layer(upper: Path, dest: Path, first: str | None = None) -> int:
    """Write the writable layer as an overlay-native tar; returns its size in bytes. The layer's
    path `first` (absolute in the sandbox), if it has one, is archived ahead of the rest, so a
    reader after it finds it in the first headers, without a walk through the whole archive."""
    excludes = [f"--xattrs-exclude={x}" for x in NODE_BOUND_XATTRS]
    members = ["."]
    if first is not None:
        ahead = f"./{sandbox_path('first', first).relative_to('/')}"
        if os.path.lexists(upper / ahead):
            # GNU tar's exclusions are positional: this one spares `ahead`, which comes before it.
            members = [ahead, "--anchored", f"--exclude={ahead}", "."]
    tools.run(
        ["tar", "-C", str(upper), *_TAR_COMMON, *excludes, "--sparse", "-cf", str(dest), *members],
        what=f"archiving writable layer {upper}",
    )
    return dest.stat().st_size


def import_layer(layer: Path, upper: Path) -> None:
    """Unpack a layer tar into an empty upper dir, whiteouts and opaque dirs included."""
    if not layer.is_file():
        raise CheckpointCorrupt(f"writable layer {layer} is missing")
    upper.mkdir(parents=True, exist_ok=True)
    try:
        tools.run(
            ["tar", "-C", str(upper), *_TAR_COMMON, "--same-permissions", "-xf", str(layer)],
            what=f"unpacking writable layer {layer}",
        )
    except Exception as exc:
        raise CheckpointCorrupt(f"writable layer {layer} cannot be unpacked: {exc}") from exc


def sandbox_path(field: str, path: str) -> PurePosixPath:
    """Validate an absolute in-sandbox path that must not climb out of the rootfs."""
    p = PurePosixPath(path)
    if not p.is_absolute() or ".." in p.parts or p == PurePosixPath("/") or "\0" in path:
        raise InvalidSpec(
            field, f"{path!r} must be an absolute file path inside the sandbox without '..' or NUL"
        )
    return p


def place_files(rootfs: Path, files: dict[str, bytes]) -> None:
    """Write spec files through the mounted rootfs, so they land in the writable layer. No
    symlink on the way is followed: one in the image must not point the write at the host."""
    for path, content in files.items():
        rel = sandbox_path(f"files[{path}]", path).relative_to("/")
        try:
            confined.write(rootfs, str(rel), content)
        except confined.Escapes as exc:
            raise InvalidSpec(f"files[{path}]", f"cannot be written: in the image, {exc}") from None
