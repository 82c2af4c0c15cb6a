"""Where a node stages a lazy restore's files in memory: only a directory of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_agent.node.staging import private_dir


@pytest.mark.timeout(10)
def test_the_dir_is_made_for_this_user_alone(tmp_path: Path) -> None:
    made = private_dir(tmp_path, "stasis-node-a")
    assert made == tmp_path / "stasis-node-a"
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.geteuid()
    assert private_dir(tmp_path, "stasis-node-a") == made, "found again by the next agent"
    assert private_dir(None, "stasis-node-a") is None


@pytest.mark.timeout(10)
def test_a_dir_others_may_enter_or_own_or_a_symlink_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", 12345, 12345)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "file").write_text("")
    for name in ("open", "theirs", "link", "file"):
        assert private_dir(tmp_path, name) is None, name
