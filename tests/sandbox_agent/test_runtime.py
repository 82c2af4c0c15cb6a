"""The sandbox runtime for real, on both backends: memory, files and sockets survive a move between
nodes, whether the checkpoint goes as a directory (restored whole) or through the snapshot store
(restored lazily on runc: the sandbox runs while its memory arrives)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from sandbox_agent import Node, SandboxSpec, SandboxState, SandboxStatus
from sandbox_agent.host import cgroups
from sandbox_agent.node import SnapshotTarget
from sandbox_agent.runtime.bundle import CGROUP_PARENT
from sandbox_agent.runtime.runc import RuncBackend, ended
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, TcpServer, recorded, remove_node_dirs, wait_for_log

MOVES = pytest.mark.parametrize(
    ("backend", "route"),
    [("runc", "directory"), ("runc", "store"), ("docker", "directory")],
    indirect=["backend"],
)
"""How a checkpoint travels, as a directory or through the snapshot store, on each backend (the
docker backend restores whole either way, so the directory covers it)."""


def _nodes(make_node: NodeFactory, backend: str, tmp_path: Path, **settings: object) -> tuple[Node, Node]:
    store = f"file://{tmp_path}/store"
    return (
        make_node("node-a", backend, snapshot_store=store, **settings),
        make_node("node-b", backend, snapshot_store=store, **settings),
    )


def _move(a: Node, b: Node, sandbox_id: str, new_id: str, route: str, tmp_path: Path) -> SandboxStatus:
    """Stop the sandbox on `a` with a checkpoint and restore it on `b` by `route`. Through the
    store, the restore on runc is lazy: it returns once the sandbox runs, memory still arriving."""
    if route == "directory":
        a.checkpoint(sandbox_id, tmp_path / "ck", leave_running=False)
        remove_node_dirs(a)
        return b.restore(new_id, tmp_path / "ck")
    a.checkpoint_to_store(
        sandbox_id, SnapshotTarget(f"{sandbox_id}-s1", sandbox_id, 1, "manual"), leave_running=False
    )
    remove_node_dirs(a)
    restored = b.restore_from_store(new_id, f"{sandbox_id}-s1", recorded(b, f"{sandbox_id}-s1"))
    assert restored.busy == (b.backend.name == "runc"), (
        "a lazily restored sandbox is busy until its memory is in"
    )
    return restored


@pytest.mark.timeout(180)
@MOVES
def test_memory_survives_move_to_another_node(
    make_node: NodeFactory, backend: str, route: str, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, backend, tmp_path)
    spec = SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "64"), address="10.201.0.2")
    a.create("mem", spec)
    log = wait_for_log(a, "mem", lambda t: t.count("sha ") >= 2)
    sha_before, _ = programs.last_sha_counter(log)

    if route == "directory":
        checkpoint = a.checkpoint("mem", tmp_path / "ck", leave_running=False)
        assert checkpoint.sizes.criu_bytes > 64 << 20
        timings = checkpoint.timings_ms
        assert timings["durable_ms"] >= timings["node_free_ms"] >= timings["dump_ms"] > 0
        if backend == "runc":  # CRIU froze the tasks itself, once runc had started, and says how long
            assert 0 < timings["frozen_ms"] < timings["dump_ms"], timings
        else:
            assert timings["frozen_ms"] >= timings["dump_ms"], timings
        assert a.list() == []
        remove_node_dirs(a)
        restored = b.restore("mem-restored", tmp_path / "ck")
    else:
        restored = _move(a, b, "mem", "mem-restored", route, tmp_path)
    assert restored.state == SandboxState.RUNNING
    assert restored.record.node == "node-b"
    before = log.count("sha ")
    after = wait_for_log(b, "mem-restored", lambda t: t.count("sha ") >= before + 2)
    sha_after, counter_after = programs.last_sha_counter(after)
    assert sha_after == sha_before
    assert after.count("start") == 1, "the process started over instead of continuing"
    counters = [int(c) for c in re.findall(r"counter (\d+)", after)]
    assert counters == sorted(counters) and len(set(counters)) == len(counters)
    assert counter_after > programs.last_sha_counter(log)[1]


@pytest.mark.timeout(180)
@MOVES
def test_files_are_exactly_as_they_were(
    make_node: NodeFactory, backend: str, route: str, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, backend, tmp_path)
    a.create("files", SandboxSpec(image="base", command=("python3", "-c", programs.FILES)))
    log = wait_for_log(a, "files", lambda t: t.count("view ") >= 2)
    assert "gone False" in log
    view_before = re.findall(r"view (\w+ \d+)", log)[-1]

    _move(a, b, "files", "files", route, tmp_path)
    after = wait_for_log(b, "files", lambda t: t.count("view ") >= log.count("view ") + 2)
    assert set(re.findall(r"view (\w+ \d+)", after)) == {view_before}
    assert after.count("gone ") == 1


@pytest.mark.timeout(120)
def test_autosave_leaves_the_sandbox_running(make_node: NodeFactory, backend: str, tmp_path: Path) -> None:
    a, b = make_node("node-a", backend), make_node("node-b", backend)
    a.create("auto", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "8")))
    log = wait_for_log(a, "auto", lambda t: "sha " in t)
    checkpoint = a.checkpoint("auto", tmp_path / "ck", leave_running=True)
    assert checkpoint.leave_running
    assert a.get("auto").state == SandboxState.RUNNING
    wait_for_log(a, "auto", lambda t: t.count("sha ") > log.count("sha ") + 1)
    b.restore("auto-copy", tmp_path / "ck")
    wait_for_log(b, "auto-copy", lambda t: t.count("sha ") > log.count("sha ") + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route", ["directory", "store"])
@pytest.mark.parametrize("backend", ["runc"], indirect=True)
def test_tcp_connection_comes_back_closed_and_reconnects(
    make_node: NodeFactory, tcp_server: TcpServer, backend: str, route: str, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, backend, tmp_path, allowed_ports=(tcp_server.port,))
    argv = ("python3", "-c", programs.TCP, "169.254.1.1", str(tcp_server.port))
    a.create("tcp", SandboxSpec(image="base", command=argv, address="10.201.0.3"))
    wait_for_log(a, "tcp", lambda t: "connected" in t)
    assert tcp_server.accepted(1) == ["10.201.0.3"]

    _move(a, b, "tcp", "tcp", route, tmp_path)
    log = wait_for_log(b, "tcp", lambda t: t.count("connected") >= 2)
    assert "reconnect after" in log
    assert tcp_server.accepted(2) == ["10.201.0.3", "10.201.0.3"], "the restored sandbox kept its own address"


def _user_namespaces_held() -> int:
    """How many user namespaces this process holds by a descriptor (id maps hold theirs so)."""
    held = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            held += os.readlink(fd).startswith("user:[")
        except OSError:  # closed meanwhile
            continue
    return held


@pytest.mark.timeout(60)
def test_a_warmed_node_has_its_id_map_before_its_first_sandbox(make_node: NodeFactory) -> None:
    """The user namespace of the node's id map takes a process: warm() makes it ahead, so the
    first restore's id-mapped mounts do not wait for it, and the sandbox then uses that one."""
    node = make_node("node-warm")
    before = _user_namespaces_held()
    node.warm()
    deadline = time.monotonic() + 10
    while _user_namespaces_held() == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _user_namespaces_held() == before + 1
    node.create("first", SandboxSpec(image="base", command=("sleep", "600")))
    assert node.get("first").state == SandboxState.RUNNING
    assert _user_namespaces_held() == before + 1, "the sandbox's mounts used the warmed map"


@pytest.mark.timeout(60)
def test_two_nodes_on_one_host_do_not_interfere(make_node: NodeFactory, tmp_path: Path) -> None:
    a, b = make_node("node-a"), make_node("node-b")
    spec = SandboxSpec(image="base", command=("sleep", "600"))
    a.create("same-id", spec)
    b.create("same-id", spec)
    assert [s.record.id for s in a.list()] == ["same-id"]
    a.delete("same-id")
    assert b.get("same-id").state == SandboxState.RUNNING
    # A restarted agent of node-a must not take node-b's containers for its own leftovers.
    a2 = make_node("node-a-again")
    assert a2.backend.remove_leftovers(set()) == []
    assert b.get("same-id").state == SandboxState.RUNNING


@pytest.mark.timeout(60)
def test_the_nodes_cgroup_stays_while_another_sandbox_makes_its_own(make_node: NodeFactory) -> None:
    """The last sandbox of a node goes while another's cgroups are being made (a verifier starting
    as its episode's sandbox is removed): the node's cgroup stays until none is in the making, and
    the host-wide parent is never removed. runc fails with ENODEV making a cgroup under a parent
    that is being removed."""
    node = make_node("node-a")
    backend = node.backend
    assert isinstance(backend, RuncBackend)
    spec = SandboxSpec(image="base", command=("sleep", "600"))
    node_cgroup = cgroups.ROOT / "memory" / CGROUP_PARENT / backend.node
    node.create("one", spec)
    with backend.making_cgroups():
        node.delete("one")
        assert node_cgroup.is_dir()
    node.create("two", spec)
    node.delete("two")
    assert not node_cgroup.exists()
    assert node_cgroup.parent.is_dir()


@pytest.mark.timeout(10)
def test_a_task_that_is_exiting_has_ended_though_it_is_no_zombie_yet() -> None:
    live = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert not ended(live)
    head, _, rest = live.rpartition(")")
    fields = rest.split()
    # A killed task leaves cgroup.procs once it starts to exit (PF_EXITING), while still running.
    exiting = [*fields[:6], str(int(fields[6]) | 0x4), *fields[7:]]
    zombie = ["Z", *fields[1:]]
    assert ended(f"{head}) {' '.join(exiting)}\n") and ended(f"{head}) {' '.join(zombie)}\n")
    # The name is the task's own, and may hold what a parser could take for the fields after it.
    assert not ended(f"1 (sh) Z 0 0 0 0 -1 0 x) {' '.join(fields)}\n")
