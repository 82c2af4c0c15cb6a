"""Creating and removing a sandbox for real (`node/create.py`, `node/remove.py`): it runs its
spec's command with the spec's files, and its removal leaves nothing behind."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from sandbox_agent import SandboxSpec, SandboxState
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log


@pytest.mark.timeout(60)
def test_exit_code_and_log(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    node.create("short", SandboxSpec(image="base", command=("sh", "-c", "echo out; echo err >&2; exit 7")))
    wait_for_log(node, "short", lambda t: "err" in t)
    deadline = time.monotonic() + 10
    while node.get("short").exit_code is None and time.monotonic() < deadline:
        time.sleep(0.1)
    status = node.get("short")
    assert status.state == SandboxState.EXITED
    assert status.exit_code == 7
    assert node.harness_log("short") == b"out\nerr\n"


@pytest.mark.timeout(60)
def test_files_from_the_spec_and_delete_leaves_nothing(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    node.create(
        "cat",
        SandboxSpec(
            image="base", command=("sh", "-c", "cat /task/prompt.txt; sleep 600"), address="10.201.0.4"
        ),
        files={"/task/prompt.txt": b"solve it\n"},
    )
    wait_for_log(node, "cat", lambda t: "solve it" in t)
    node.delete("cat")
    assert node.list() == []
    assert not (node.settings.root / "sandboxes" / "cat").exists()
    assert not Path("/sys/class/net").joinpath("stx").exists()
    assert shutil.which("runc")
