"""Fork children, for real on runc and CRIU: another episode's snapshot restored as new sandboxes
with identities of their own (address, host name, machine-id, /.stasis/fork.json), on the
parent's node and on another, all running at once beside the parent."""

from __future__ import annotations

import re
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent import (
    AlreadyExists,
    FailedPrecondition,
    ForkMark,
    Identity,
    InvalidSpec,
    Node,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
)
from sandbox_agent.criu import images as criu_images
from sandbox_agent.criu import lazy
from sandbox_agent.node import SnapshotTarget
from sandbox_agent.node.identity import machine_id
from snapshots import RetentionPolicy, SnapshotStore
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, TcpServer, lazy_daemons, recorded, staged, wait_for_log

GATEWAY = "169.254.1.1"
Ticks = list[dict[str, Any]]
"""What a FORKED program logged, one dict a tick."""


def _nodes(make_node: NodeFactory, tmp_path: Path, **settings: object) -> tuple[Node, Node]:
    store = f"file://{tmp_path}/store"
    return (
        make_node("node-a", snapshot_store=store, **settings),
        make_node("node-b", snapshot_store=store, **settings),
    )


def _own_ticks(node: Node, status: SandboxStatus) -> Ticks:
    """What the restored sandbox's processes logged themselves (the log before is the parent's)."""
    content, _ = node.log_page(status.record.id, 1 << 20, status.record.log_start)
    return programs.ticks(content.decode())


def _inherited_ticks(node: Node, status: SandboxStatus) -> Ticks:
    content, _ = node.log_page(status.record.id, 1 << 20, 0)
    return programs.ticks(content[: status.record.log_start].decode())


def _wait_for_ticks(
    node: Node, status: SandboxStatus, done: Callable[[Ticks], bool], timeout_s: float = 30
) -> Ticks:
    """The restored sandbox's own ticks, once `done` says they are enough."""
    wait_for_log(node, status.record.id, lambda _: done(_own_ticks(node, status)), timeout_s)
    return _own_ticks(node, status)


def _connected(ticks: Ticks) -> bool:
    return any(t["tcp"] == "connected" for t in ticks)


@pytest.mark.timeout(240)
def test_fork_children_start_from_the_snapshot_with_their_own_identity_and_diverge(
    make_node: NodeFactory, tcp_server: TcpServer, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, tmp_path, allowed_ports=(tcp_server.port,))
    argv = ("python3", "-c", programs.FORKED, GATEWAY, str(tcp_server.port))
    spec = SandboxSpec(image="base", command=argv, address="10.201.0.20", hostname="parent")
    parent = a.create("ep-parent-r1", spec)
    wait_for_log(a, "ep-parent-r1", lambda t: len(programs.ticks(t)) >= 5 and _connected(programs.ticks(t)))
    a.checkpoint_to_store(
        "ep-parent-r1", SnapshotTarget("ep-parent-s1", "ep-parent", 1, "manual"), leave_running=True
    )
    digest = recorded(a, "ep-parent-s1")

    placements = [(a, "10.201.0.21"), (a, "10.201.0.22"), (b, "10.201.0.23")]
    children = []
    for index, (node, address) in enumerate(placements):
        mark = ForkMark(f"ep-child{index}", "ep-parent", "ep-parent-s1", index, len(placements))
        status = node.restore_from_store(
            f"ep-child{index}-r1", "ep-parent-s1", digest,
            identity=Identity(address=address, hostname=f"child-{index}", fork=mark),
        )  # fmt: skip
        assert status.record.spec.address == address and status.record.spec.hostname == f"child-{index}"
        assert status.record.spec.env == parent.record.spec.env
        assert status.record.spec.command == parent.record.spec.command
        children.append((node, status, mark))

    for node, status, mark in children:
        index, address = mark.index, status.record.spec.address
        ticks = _wait_for_ticks(node, status, lambda t: len(t) >= 3 and _connected(t))
        inherited = _inherited_ticks(node, status)
        assert inherited and all(t["host"] == "parent" for t in inherited), "the parent's log comes along"
        # Memory: the counter goes on from where the parent's was at the snapshot, and the
        # random state in memory is the parent's (what a fork clones).
        assert ticks[0]["counter"] == inherited[-1]["counter"] + 1
        assert {t["secret"] for t in ticks} == {inherited[0]["secret"]}
        # Identity: from its first instant on, never the parent's.
        assert {t["host"] for t in ticks} == {f"child-{index}"}
        assert {t["machine_id"] for t in ticks} == {f"{machine_id(mark.episode_id)}\n"}
        described = {
            "episode_id": mark.episode_id, "parent_episode_id": "ep-parent", "snapshot_id": "ep-parent-s1",
            "index": index, "count": 3,
        }  # fmt: skip
        assert all(t["fork"] == described for t in ticks)
        # Files diverge: each child appended its own index to a file of the parent's layer.
        assert {t["branch"] for t in ticks} == {f"child {index}\n"}
        # The parent's connection could not keep its address: it came back closed, and the
        # child reconnected from its own.
        assert ticks[0]["tcp"].startswith("reconnect after"), ticks[0]
        assert {t["address"] for t in ticks if t["tcp"] == "connected"} == {address}

    assert sorted(set(tcp_server.accepted(4))) == ["10.201.0.20", "10.201.0.21", "10.201.0.22", "10.201.0.23"]
    # All at once, beside the parent, which goes on as it was: no fork of its own.
    assert {s.record.id: s.state for s in a.list()} == {
        "ep-parent-r1": SandboxState.RUNNING, "ep-child0-r1": SandboxState.RUNNING,
        "ep-child1-r1": SandboxState.RUNNING,
    }  # fmt: skip
    assert b.get("ep-child2-r1").state == SandboxState.RUNNING
    before = len(programs.ticks(a.harness_log("ep-parent-r1", 1 << 20).decode()))
    log = wait_for_log(a, "ep-parent-r1", lambda t: len(programs.ticks(t)) > before + 2)
    latest = programs.ticks(log)[-1]
    assert (latest["host"], latest["fork"], latest["branch"], latest["address"]) == (
        "parent", None, None, "10.201.0.20"
    )  # fmt: skip
    assert latest["machine_id"] not in {f"{machine_id(m.episode_id)}\n" for _, _, m in children}


PLANT = r"""
import os, sys, time
for path, target in (("/etc/machine-id", sys.argv[1]), ("/.stasis/fork.json", sys.argv[2])):
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)
print("planted", flush=True)
while True:
    links = [os.path.islink(p) for p in ("/etc/machine-id", "/.stasis/fork.json")]
    print("view", links, repr(open("/etc/machine-id").read()) if not links[0] else "-", flush=True)
    time.sleep(0.1)
"""


@pytest.mark.timeout(120)
def test_a_symlink_the_harness_planted_is_replaced_never_followed(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """The parent points /etc/machine-id and /.stasis/fork.json at node files: the node, which
    writes a fork child's files as root, replaces the links and leaves those files alone."""
    a, b = _nodes(make_node, tmp_path)
    targets = [tmp_path / "node-file-1", tmp_path / "node-file-2"]
    for target in targets:
        target.write_text("the node's own\n")
    argv = ("python3", "-c", PLANT, *map(str, targets))
    a.create("ep-plant-r1", SandboxSpec(image="base", command=argv))
    wait_for_log(a, "ep-plant-r1", lambda t: "view [True, True]" in t)
    a.checkpoint_to_store(
        "ep-plant-r1", SnapshotTarget("ep-plant-s1", "ep-plant", 1, "manual"), leave_running=True
    )

    mark = ForkMark("ep-planted", "ep-plant", "ep-plant-s1", 0, 1)
    child = b.restore_from_store(
        "ep-planted-r1", "ep-plant-s1", recorded(b, "ep-plant-s1"), identity=Identity(fork=mark)
    )
    log = wait_for_log(b, "ep-planted-r1", lambda t: "view [False, False]" in t[child.record.log_start :])
    assert f"view [False, False] {machine_id(mark.episode_id) + chr(10)!r}" in log
    assert [t.read_text() for t in targets] == ["the node's own\n"] * 2
    assert child.record.spec.hostname == "sandbox", "no host name given: the checkpoint's"


MOVE_STATE_DIR = r"""
import os, sys, time
os.rename("/.stasis", "/.stasis-moved")
os.symlink(sys.argv[1], "/.stasis")
print("moved", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_state_dir_the_harness_made_a_symlink_refuses_the_child_and_leaves_nothing(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, tmp_path)
    node_dir = tmp_path / "node-dir"
    node_dir.mkdir()
    a.create(
        "ep-moved-r1", SandboxSpec(image="base", command=("python3", "-c", MOVE_STATE_DIR, str(node_dir)))
    )
    layer = a.backend.upper_dir(a.get("ep-moved-r1").record, a.sandboxes.layout("ep-moved-r1"))
    deadline = time.monotonic() + 10
    while not (layer / ".stasis").is_symlink() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (layer / ".stasis").is_symlink(), "the harness moved its state dir"
    a.checkpoint_to_store(
        "ep-moved-r1", SnapshotTarget("ep-moved-s1", "ep-moved", 1, "manual"), leave_running=True
    )
    mark = ForkMark("ep-moved-kid", "ep-moved", "ep-moved-s1", 0, 1)
    with pytest.raises(FailedPrecondition, match=r"/\.stasis/fork\.json cannot be written.*not a directory"):
        b.restore_from_store(
            "ep-moved-kid-r1", "ep-moved-s1", recorded(b, "ep-moved-s1"), identity=Identity(fork=mark)
        )
    assert (
        b.list() == [] and not staged(b) and not (b.settings.root / "sandboxes" / "ep-moved-kid-r1").exists()
    )
    assert list(node_dir.iterdir()) == []


@pytest.mark.timeout(120)
def test_a_bad_identity_is_refused_naming_the_field_and_leaves_nothing(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    a, b = _nodes(make_node, tmp_path)
    ready = ("python3", "-c", "import time; print('ready', flush=True); time.sleep(600)")
    a.create("ep-src-r1", SandboxSpec(image="base", command=ready, address="10.201.0.30"))
    # Checkpointed once it runs: a task still loading its program from a busy disk cannot be
    # frozen (D state), and CRIU gives up on it.
    wait_for_log(a, "ep-src-r1", lambda t: "ready" in t)
    a.checkpoint_to_store("ep-src-r1", SnapshotTarget("ep-src-s1", "ep-src", 1, "manual"), leave_running=True)
    digest = recorded(a, "ep-src-s1")
    mark = ForkMark("ep-kid", "ep-src", "ep-src-s1", 0, 2)
    bad = {
        "address": Identity(address="10.201.0.300"),
        "hostname": Identity(hostname="Not_A_Host"),
        "fork.index": Identity(fork=ForkMark("ep-kid", "ep-src", "ep-src-s1", 2, 2)),
        "fork.count": Identity(fork=ForkMark("ep-kid", "ep-src", "ep-src-s1", 0, 0)),
        "fork.episode_id": Identity(fork=ForkMark("../kid", "ep-src", "ep-src-s1", 0, 2)),
        "fork.snapshot_id": Identity(fork=ForkMark("ep-kid", "ep-src", "ep-src-s7", 0, 2)),
    }
    for node in (a, b):
        for field, identity in bad.items():
            with pytest.raises(InvalidSpec) as err:
                node.restore_from_store("ep-kid-r1", "ep-src-s1", digest, identity=identity)
            assert err.value.field == field, err.value
            assert [s.record.id for s in node.list()] == (["ep-src-r1"] if node is a else [])
            assert not staged(node)
            assert not (node.settings.root / "sandboxes" / "ep-kid-r1").exists()
    # The parent's address is the parent's: a child on its node must be given its own.
    with pytest.raises(AlreadyExists, match=r"10\.201\.0\.30"):
        a.restore_from_store("ep-kid-r1", "ep-src-s1", digest, identity=Identity(fork=mark))
    assert [s.record.id for s in a.list()] == ["ep-src-r1"]
    ok = a.restore_from_store(
        "ep-kid-r1", "ep-src-s1", digest, identity=Identity(address="10.201.0.31", hostname="kid", fork=mark)
    )
    assert ok.state == SandboxState.RUNNING and ok.record.spec.address == "10.201.0.31"


@pytest.mark.timeout(10)
def test_a_machine_id_is_32_lowercase_hex_of_the_episode_alone() -> None:
    ids = {machine_id(f"ep-{n:010x}") for n in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) and i.strip("0") for i in ids)
    assert machine_id("ep-0a1b2c3d4e") == machine_id("ep-0a1b2c3d4e")


@pytest.mark.timeout(10)
def test_the_uts_namespace_image_is_renamed_and_a_damaged_one_refused(tmp_path: Path) -> None:
    """A UTS namespace's image (these bytes CRIU 4 wrote for a sandbox named `parent-host`) gets
    the child's name and keeps its domain name; a damaged one, or none, is refused."""
    written = bytes.fromhex("1943565403324754150000000a0b706172656e742d686f73741206286e6f6e6529")
    (tmp_path / "utsns-12.img").write_bytes(written)
    criu_images.rename_host(tmp_path, "child-7")
    body = b"\x0a\x07child-7\x12\x06(none)"  # nodename, then the domain name as it was
    assert (tmp_path / "utsns-12.img").read_bytes() == written[:8] + struct.pack("<I", len(body)) + body

    (tmp_path / "utsns-12.img").write_bytes(written[:20])
    with pytest.raises(ValueError, match=r"utsns-12\.img is damaged"):
        criu_images.rename_host(tmp_path, "child-7")
    (tmp_path / "utsns-12.img").unlink()
    with pytest.raises(ValueError, match="no UTS namespace"):
        criu_images.rename_host(tmp_path, "child-7")


QUIET = r"""
import hashlib, random, signal, sys, time
buf = bytearray(random.Random(1234).randbytes(int(sys.argv[1]) << 20))
def report(*_):
    print("sha", hashlib.sha256(buf).hexdigest(), flush=True)
signal.signal(signal.SIGUSR1, report)
report()
while True:
    time.sleep(0.05)
"""
"""Memory it touches only when asked (SIGUSR1), to report its checksum."""


def _rss_mib(node: Node, sandbox_id: str) -> float:
    """The resident set of the sandbox's program (its init's only child)."""
    init = node.get(sandbox_id).pid
    child = int(Path(f"/proc/{init}/task/{init}/children").read_text().split()[0])
    status = Path(f"/proc/{child}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _reported(node: Node, sandbox_id: str, count: int) -> str:
    """Ask the program for its memory's checksum; the checksum it reports."""
    node.kill(sandbox_id, signal.SIGUSR1)
    log = wait_for_log(node, sandbox_id, lambda t: t.count("sha ") >= count, timeout=60)
    return re.findall(r"sha (\w+)", log)[-1]


@pytest.mark.timeout(240)
def test_a_childs_memory_arrives_as_it_touches_it_and_whole_before_its_checkpoint(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """A fork child's memory is held: it runs, not busy, holding only the pages it touched (a
    fork's idle children so cost a fraction of the parent each). Its checkpoint lets the rest in
    first, so the snapshot holds the memory whole; a child that touches much is let have the rest
    at once; and removing a held child stops its CRIU daemon, which would wait for faults for good."""
    a, b = _nodes(make_node, tmp_path)
    size = 2 * lazy.HELD_BYTES >> 20  # a child that reads all of it is let have the rest
    a.create("quiet-r1", SandboxSpec(image="base", command=("python3", "-c", QUIET, str(size))))
    sha = re.findall(r"sha (\w+)", wait_for_log(a, "quiet-r1", lambda t: "sha " in t))[0]
    a.checkpoint_to_store("quiet-r1", SnapshotTarget("quiet-s1", "quiet", 1, "fork"), leave_running=False)
    digest = recorded(a, "quiet-s1")

    def child(index: int) -> SandboxStatus:
        mark = ForkMark(f"quiet-c{index}", "quiet", "quiet-s1", index, 3)
        identity = Identity(address=f"10.201.0.{40 + index}", hostname=f"c{index}", fork=mark)
        return b.restore_from_store(f"quiet-c{index}-r1", "quiet-s1", digest, identity=identity)

    children = [child(i) for i in range(3)]
    assert not any(b.get(c.record.id).busy for c in children), "a held child is not busy: it can be used"
    time.sleep(1.0)
    assert all(_rss_mib(b, c.record.id) < size / 4 for c in children), "idle, each holds what it touched"
    assert len(lazy_daemons(b)) == 3, "each child's daemon waits for its faults"
    assert len(staged(b)) == 3 and not any((d / "layer.tar").exists() for d in staged(b)), (
        "what each keeps staged is CRIU's images alone: its layer is in the sandbox"
    )
    with SnapshotStore.open(f"file://{tmp_path}/store") as store:  # nothing held locks it meanwhile
        store.gc(RetentionPolicy(keep_last=1), resume_points={f"quiet-c{i}": "quiet-s1" for i in range(3)})

    b.checkpoint_to_store(
        "quiet-c0-r1", SnapshotTarget("quiet-c0-s1", "quiet-c0", 1, "manual"), leave_running=False
    )
    assert len(lazy_daemons(b)) == 2, "its checkpoint let the rest of its memory in first"
    a.restore_from_store("quiet-c0-r2", "quiet-c0-s1", recorded(a, "quiet-c0-s1"))
    deadline = time.monotonic() + 60
    while a.get("quiet-c0-r2").busy:  # a plain restore's memory arrives all before its next signal
        assert time.monotonic() < deadline, "the memory never all arrived"
        time.sleep(0.05)
    assert _reported(a, "quiet-c0-r2", 2) == sha, "the child's snapshot holds its memory whole"

    assert _reported(b, "quiet-c1-r1", 2) == sha, "every page it touched arrived right"
    deadline = time.monotonic() + 60
    while len(lazy_daemons(b)) > 1:
        assert time.monotonic() < deadline, "a busy child's memory was held on"
        time.sleep(0.05)

    b.delete("quiet-c2-r1")
    assert lazy_daemons(b) == [], "removing a held child stops its daemon"
