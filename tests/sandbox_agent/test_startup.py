"""An agent's start-up for real (`node/startup.py`): what a crashed agent left half done is
finished or undone, so the sandbox runs on as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_agent import SandboxSpec, SandboxState
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log

# An agent process that dies the instant a stopping checkpoint starts on the layer: after the
# kill, before the commit, with no cleanup of its own.
_DIES_AFTER_THE_KILL = """
import os, sys
from pathlib import Path
from sandbox_agent import AgentSettings, Node, Phase, PhaseHooks
node, root, images, sandbox, dest = sys.argv[1:]

def die(phase, sandbox_id):
    if phase == Phase.LAYER:
        os._exit(17)

agent = Node(AgentSettings(node=node, root=Path(root), image_cache=Path(images)), hooks=PhaseHooks(before=die))
agent.checkpoint(sandbox, Path(dest), leave_running=False)
"""


@pytest.mark.timeout(60)
def test_restarted_agent_thaws_a_sandbox_an_interrupted_checkpoint_froze(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    node.create("frozen", SandboxSpec(image="base", command=("sleep", "600")))
    record = node.get("frozen").record
    layout = node.sandboxes.layout("frozen")
    node.backend.freeze(record, layout)
    # It died inside a stopping dump: the sandbox is marked as stopped, but CRIU never got to
    # kill it. Reviving it from images that were never finished would lose it.
    layout.stopped.write_text(str(layout.dir / "never-written"))
    assert node.get("frozen").state == SandboxState.PAUSED
    restarted = make_node("node-a")  # the same node root: the agent came back
    status = restarted.get("frozen")
    assert status.state == SandboxState.RUNNING and status.pid == node.get("frozen").pid
    assert not layout.stopped.exists()


@pytest.mark.timeout(120)
def test_an_agent_that_dies_between_the_kill_and_the_commit_revives_the_sandbox_on_restart(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    a = make_node("node-a")
    a.create("crashy", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "8")))
    log = wait_for_log(a, "crashy", lambda t: t.count("sha ") >= 2)
    sha_before, _ = programs.last_sha_counter(log)
    settings = a.settings
    assert settings.image_cache is not None
    died = subprocess.run(
        [sys.executable, "-c", _DIES_AFTER_THE_KILL, settings.node, str(settings.root),
         str(settings.image_cache), "crashy", str(tmp_path / "ck")],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert died.returncode == 17, died.stderr.decode()
    assert a.get("crashy").state == SandboxState.EXITED, "killed, and its snapshot never committed"
    logged = a.harness_log("crashy").count(b"sha ")

    restarted = make_node("node-a")
    assert restarted.get("crashy").state == SandboxState.RUNNING
    after = wait_for_log(restarted, "crashy", lambda t: t.count("sha ") > logged + 1)
    sha_after, _ = programs.last_sha_counter(after)
    assert sha_after == sha_before and after.count("start") == 1, "revived with its memory, not restarted"
    assert not (tmp_path / "ck").exists() and not list(tmp_path.glob(".crashy.partial-*"))
