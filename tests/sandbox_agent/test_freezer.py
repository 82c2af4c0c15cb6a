"""Freezing a sandbox's cgroup without runc, as checkpoints do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox_agent import SandboxSpec, SandboxState
from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.host import freezer
from sandbox_agent.runtime import bundle
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log

COUNTER = "import time\ni = 0\nwhile True:\n    i += 1\n    print(i, flush=True)\n    time.sleep(0.01)"


def _lines(node_log: bytes) -> int:
    return node_log.count(b"\n")


@pytest.mark.timeout(60)
def test_a_frozen_sandbox_stops_and_runc_sees_it_paused(make_node: NodeFactory) -> None:
    node = make_node("frz")
    node.create("counter", SandboxSpec(image="base", command=("python3", "-c", COUNTER)))
    wait_for_log(node, "counter", lambda text: text.count("\n") > 3)
    record = node.get("counter").record
    cgroup = bundle.cgroups_path(node.host_key, record.id)

    freezer.freeze(cgroup)
    try:
        assert node.get("counter").state == SandboxState.PAUSED, "runc reads the freezer back"
        before = _lines(node.harness_log("counter", 1 << 20))
        time.sleep(0.3)
        assert _lines(node.harness_log("counter", 1 << 20)) == before, "a frozen task prints nothing"
    finally:
        freezer.thaw(cgroup)
    assert node.get("counter").state == SandboxState.RUNNING
    wait_for_log(node, "counter", lambda text: text.count("\n") > before + 3)


@pytest.mark.timeout(30)
def test_a_freeze_that_does_not_complete_is_given_up_and_thawed(tmp_path: Path) -> None:
    # A unified (v2) hierarchy whose tasks never all stop: cgroup.events keeps saying so.
    root = tmp_path / "cgroup"
    sandbox = root / "stasis" / "n" / "s"
    sandbox.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (sandbox / "cgroup.freeze").write_text("0\n")
    (sandbox / "cgroup.events").write_text("populated 1\nfrozen 0\n")

    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match=r"did not freeze within 0\.2 s"):
        freezer.freeze("/stasis/n/s", root, timeout_s=0.2)
    assert time.monotonic() - started < 2
    assert (sandbox / "cgroup.freeze").read_text() == "0", "the cgroup is left thawed"

    (sandbox / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    freezer.freeze("/stasis/n/s", root, timeout_s=0.2)
    assert (sandbox / "cgroup.freeze").read_text() == "1"


def test_a_cgroup_without_a_freezer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="has no freezer"):
        freezer.freeze("/stasis/n/gone", tmp_path)
