"""The runc backend drives CRIU over its RPC, without runc: a restored sandbox gets the cgroups runc
gives a started one, is known without runc's state, and CRIU's failures come back as errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from protos.criu import rpc_pb2 as rpc
from sandbox_agent import Node, SandboxSpec, SandboxState
from sandbox_agent.criu import core
from sandbox_agent.errors import CommandFailed
from sandbox_agent.host import cgroups
from sandbox_agent.spec import Resources
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log

SETTINGS = (
    "memory/memory.limit_in_bytes", "cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us", "pids/pids.max",
    "devices/devices.list", "cpuset/cpuset.cpus", "cpuset/cpuset.mems",
)  # fmt: skip


def _cgroup_view(node: Node, sandbox_id: str) -> tuple[dict[str, str], list[str]]:
    """The sandbox's cgroup settings, and its init's cgroups with the node and id taken out."""
    inner = f"stasis/{node.name}/{sandbox_id}"
    settings = {f: (cgroups.ROOT / f.split("/")[0] / inner / f.split("/")[1]).read_text() for f in SETTINGS}
    _, pid = node.backend.status(node.sandboxes.record(sandbox_id), node.sandboxes.layout(sandbox_id))
    own = Path(f"/proc/{pid}/cgroup").read_text().replace(f"/{inner}", "/SANDBOX").splitlines()
    return settings, sorted(own)


@pytest.mark.timeout(120)
def test_a_restored_sandbox_has_the_cgroups_runc_gives_a_started_one(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    if not cgroups.v1():
        pytest.skip("on a cgroup v2-only host runc restores")
    a, b = make_node("node-a"), make_node("node-b")
    spec = SandboxSpec(
        image="base",
        command=("python3", "-c", programs.MEMORY, "4"),
        resources=Resources(memory_mb=700, cpus=0.5, pids=300),
    )
    a.create("s", spec)
    wait_for_log(a, "s", lambda t: "sha " in t)
    a.checkpoint("s", tmp_path / "ck", leave_running=True)
    b.restore("s", tmp_path / "ck")
    assert b.backend.name == "runc"
    assert not (b.settings.root / "runc" / "s").exists(), "runc was not asked to restore"
    started, restored = _cgroup_view(a, "s"), _cgroup_view(b, "s")
    assert restored == started
    assert restored[0]["memory/memory.limit_in_bytes"].strip() == str(700 << 20)
    assert restored[0]["cpu/cpu.cfs_quota_us"].strip() == "50000"
    # Known without runc: paused while frozen, and killed through its cgroup.
    before = b.harness_log("s").count(b"sha ")
    wait_for_log(b, "s", lambda t: t.count("sha ") > before)
    record, layout = b.sandboxes.record("s"), b.sandboxes.layout("s")
    b.backend.freeze(record, layout)
    assert b.backend.status(record, layout)[0] == SandboxState.PAUSED
    b.backend.thaw(record, layout)
    b.backend.kill(record, layout, 9)
    deadline = time.monotonic() + 10
    while b.backend.status(record, layout)[0] != SandboxState.EXITED:
        assert time.monotonic() < deadline, "the restored sandbox outlived SIGKILL"
        time.sleep(0.05)
    b.delete("s")
    assert not any((h / "stasis" / "node-b" / "s").exists() for h in cgroups.hierarchies())


@pytest.mark.timeout(60)
def test_a_pid_file_naming_a_process_outside_the_sandbox_is_not_the_sandbox(make_node: NodeFactory) -> None:
    a = make_node("node-a")
    a.create("s", SandboxSpec(image="base", command=("sleep", "600")))
    record, layout = a.sandboxes.record("s"), a.sandboxes.layout("s")
    state, pid = a.backend.status(record, layout)
    assert state == SandboxState.RUNNING and pid > 0
    pid_file = layout.dir / "init.pid"
    pid_file.write_text(str(os.getpid()))  # the init's pid, reused by a process elsewhere
    assert a.backend.status(record, layout) == (SandboxState.EXITED, 0)
    pid_file.write_text(str(pid))
    assert a.backend.status(record, layout) == (SandboxState.RUNNING, pid)


def _fake_criu(tmp_path: Path, body: str) -> str:
    script = tmp_path / "criu"
    script.write_text(f"#!/bin/sh\necho $$ >{tmp_path}/pid\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.timeout(30)
def test_criu_that_exits_without_answering_is_an_error(tmp_path: Path) -> None:
    criu = _fake_criu(tmp_path, "exit 3")
    with pytest.raises(CommandFailed, match=r"CRIU dump of x \(exit 3\).*\n.*exited without answering"):
        core.swrk(criu, rpc.criu_req(type=rpc.DUMP), what="CRIU dump of x", timeout_s=10)


@pytest.mark.timeout(30)
def test_criu_that_does_not_answer_in_time_is_killed(tmp_path: Path) -> None:
    criu = _fake_criu(tmp_path, "exec sleep 60")
    placed: list[int] = []
    started = time.monotonic()
    with pytest.raises(CommandFailed, match=r"killed, timed out after 0.5 s"):
        core.swrk(criu, rpc.criu_req(type=rpc.DUMP), what="x", timeout_s=0.5, placed=placed.append)
    assert time.monotonic() - started < 5
    pid = int((tmp_path / "pid").read_text())
    assert placed == [pid], "the caller placed CRIU before its request"
    assert not Path(f"/proc/{pid}").exists(), "the hung CRIU was killed and reaped"


@pytest.mark.timeout(30)
def test_criu_refusing_a_request_is_an_error_with_its_reason(tmp_path: Path) -> None:
    images = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        opts = rpc.criu_opts(images_dir_fd=images, pid=(1 << 22) - 1, log_file="dump.log", log_level=4)
        with pytest.raises(CommandFailed, match="CRIU dump of nothing"):
            core.swrk("criu", rpc.criu_req(type=rpc.DUMP, opts=opts), what="CRIU dump of nothing",
                      timeout_s=20, pass_fds=(images,))  # fmt: skip
    finally:
        os.close(images)
    assert "Error" in (tmp_path / "dump.log").read_text()
