"""The node makes moves between cgroups fast (`favordynmods`) and leaves a host it cannot tune as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_agent.host import cgroups
from tests.sandbox_agent.conftest import NodeFactory

V1 = "30 25 0:27 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset"


def _mountinfo(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


@pytest.mark.timeout(10)
def test_cgroup2_mounts_are_read_with_their_superblock_options(tmp_path: Path) -> None:
    info = _mountinfo(
        tmp_path,
        V1,
        "41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot",
    )
    assert cgroups._cgroup2_mounts(info) == [
        (Path("/sys/fs/cgroup/uni fied"), ["rw", "nsdelegate", "memory_recursiveprot"])
    ]


@pytest.mark.timeout(10)
def test_a_host_that_already_favors_moves_is_not_remounted(tmp_path: Path) -> None:
    # Its mount point does not exist: a remount would fail.
    info = _mountinfo(tmp_path, V1, f"41 31 0:38 / {tmp_path}/absent rw - cgroup2 cgroup2 rw,favordynmods")
    assert cgroups.favor_moves(info)


@pytest.mark.timeout(10)
def test_a_host_it_cannot_tune_is_left_as_it_was(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert not cgroups.favor_moves(_mountinfo(tmp_path, V1))
    assert "no cgroup2 mount" in caplog.text
    not_a_mount = tmp_path / "not-a-mount"
    not_a_mount.mkdir()
    assert not cgroups.favor_moves(
        _mountinfo(tmp_path, f"41 31 0:38 / {not_a_mount} rw - cgroup2 cgroup2 rw")
    )
    assert f"could not remount {not_a_mount}" in caplog.text


@pytest.mark.timeout(60)
def test_a_runc_node_favors_moves_on_its_host(make_node: NodeFactory) -> None:
    make_node("cgm")
    mounts = cgroups._cgroup2_mounts(Path("/proc/self/mountinfo"))
    assert mounts, "this host has a unified hierarchy beside v1 (DESIGN.md)"
    assert any(cgroups.OPTION in options for _, options in mounts)
