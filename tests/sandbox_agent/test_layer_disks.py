"""Spare layer filesystems, made with the real mkfs.ext4 in a temporary dir."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.host import overlay
from sandbox_agent.host.layer_disks import LayerDisks

SMALL = (16, 1024)
OTHER = (32, 2048)
EXT4_MAGIC_AT = 0x438


def _is_ext4(image: Path, size_mb: int) -> bool:
    with open(image, "rb") as f:
        f.seek(EXT4_MAGIC_AT)
        magic = f.read(2)
    return magic == b"\x53\xef" and image.stat().st_size == size_mb << 20


def _spares(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.img"))


def _wait_for(predicate: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("the spares were not made in time")


@pytest.mark.timeout(60)
def test_a_placed_disk_is_a_spare_made_ahead_and_the_spare_is_made_again_later(tmp_path: Path) -> None:
    spares = tmp_path / "spares"
    disks = LayerDisks(spares, per_size=2, quiet_s=2.0)
    try:
        disks.warm(SMALL)
        _wait_for(lambda: len(_spares(spares)) == 2)
        made = set(_spares(spares))
        disks.place(tmp_path / "sandbox.img", SMALL)
        assert _is_ext4(tmp_path / "sandbox.img", SMALL[0])
        assert len(set(_spares(spares)) & made) == 1, "one spare was taken, by a rename"
        time.sleep(0.5)
        assert len(_spares(spares)) == 1, "no spare is made while the restore that took one goes on"
        _wait_for(lambda: len(_spares(spares)) == 2)
        assert all(_is_ext4(p, SMALL[0]) for p in _spares(spares))
    finally:
        disks.close()
    assert _spares(spares) == [], "close removes the spares"


@pytest.mark.timeout(60)
def test_without_a_spare_the_disk_is_made_at_once(tmp_path: Path) -> None:
    disks = LayerDisks(tmp_path / "spares")
    try:
        disks.place(tmp_path / "sandbox.img", OTHER)
        assert _is_ext4(tmp_path / "sandbox.img", OTHER[0])
    finally:
        disks.close()


@pytest.mark.timeout(60)
def test_only_the_last_sizes_asked_for_keep_spares(tmp_path: Path) -> None:
    spares = tmp_path / "spares"
    disks = LayerDisks(spares, per_size=1, sizes=1)
    try:
        disks.warm(SMALL)
        _wait_for(lambda: [p.name.split("-")[0] for p in _spares(spares)] == ["16"])
        disks.place(tmp_path / "sandbox.img", OTHER)  # made at once; SMALL's spare goes
        _wait_for(lambda: [p.name.split("-")[0] for p in _spares(spares)] == ["32"])
    finally:
        disks.close()


@pytest.mark.timeout(60)
def test_what_an_earlier_agent_left_is_not_used(tmp_path: Path) -> None:
    spares = tmp_path / "spares"
    spares.mkdir()
    (spares / "16-1024-left.img").write_bytes(b"not a filesystem")
    (spares / "16-1024-cut.partial").write_bytes(b"")
    disks = LayerDisks(spares)
    try:
        assert list(spares.iterdir()) == []
        disks.place(tmp_path / "sandbox.img", SMALL)
        assert _is_ext4(tmp_path / "sandbox.img", SMALL[0])
    finally:
        disks.close()


@pytest.mark.timeout(60)
def test_a_spare_that_cannot_be_made_stops_the_refill_not_the_placing(tmp_path: Path) -> None:
    spares = tmp_path / "spares"
    disks = LayerDisks(spares)
    try:
        spares.rmdir()  # the node's root went away under it
        disks.warm(SMALL)
        time.sleep(0.5)
        disks.place(tmp_path / "sandbox.img", SMALL)
        assert _is_ext4(tmp_path / "sandbox.img", SMALL[0])
    finally:
        disks.close()


def _attached(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(60)
def test_a_layer_disk_mounts_on_a_loop_device_that_goes_with_the_mount(tmp_path: Path) -> None:
    """The agent attaches the loop device itself, as `mount -o loop` did: the disk mounts
    nosuid and nodev, takes files, and its device detaches once it is unmounted."""
    image, target = tmp_path / "layer.img", tmp_path / "layer"
    overlay.make_layer_fs(image, *SMALL)
    overlay.mount_layer_disk(image, target)
    try:
        assert overlay.is_mounted(target)
        options = next(line.split()[3] for line in Path("/proc/self/mounts").read_text().splitlines()
                       if line.split()[1] == str(target))  # fmt: skip
        assert {"nosuid", "nodev", "rw"} <= set(options.split(","))
        (target / "kept").write_text("a file")
        assert str(image) in _attached(image)
    finally:
        overlay.unmount(target)
    assert _attached(image) == "", "the loop device detached with the unmount"
    overlay.mount_layer_disk(image, target)  # and mounts again, the file still there
    try:
        assert (target / "kept").read_text() == "a file"
    finally:
        overlay.unmount(target)


@pytest.mark.timeout(60)
def test_a_layer_disk_that_is_no_filesystem_is_refused_and_holds_no_loop_device(tmp_path: Path) -> None:
    image, target = tmp_path / "garbage.img", tmp_path / "layer"
    image.write_bytes(b"\xff" * (1 << 20))
    with pytest.raises(FailedPrecondition, match=f"mounting {image} \\(/dev/loop\\d+\\) at {target}"):
        overlay.mount_layer_disk(image, target)
    assert not overlay.is_mounted(target)
    assert _attached(image) == ""
