"""Lazy restore for real (runc, CRIU's lazy-pages daemon, the snapshot store): the sandbox runs
before its memory is on the node, and a fault while pages are still being served fails that
restore, removes the sandbox and leaves the snapshot intact for another try.

Faults come in through the node's seams (`faults`): a slow or failing snapshot store around the
real one, and a runtime whose restore fails at a chosen step around the real runc."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from sandbox_agent import Node, SandboxSpec
from sandbox_agent.criu import images as criu_images
from sandbox_agent.criu import lazy, pagemap
from sandbox_agent.errors import CommandFailed
from sandbox_agent.node import SnapshotTarget
from snapshots import Alignment, Segment, SnapshotStore, StoreUnavailable
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import (
    NodeFactory,
    lazy_daemons,
    recorded,
    remove_node_dirs,
    staged,
    wait_for_log,
)
from tests.sandbox_agent.faults import RestoreFaults, StoreFaults

MIB = 64


def _snapshot(make_node: NodeFactory, tmp_path: Path, **b_settings: object) -> tuple[Node, str]:
    """A MEMORY program's snapshot in a fresh store, its node gone; the node to restore on, and
    the checksum of the memory it had. `b_settings` may give that node's seams too (`faults`)."""
    store = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=store), make_node("node-b", snapshot_store=store, **b_settings)
    a.create("mem", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, str(MIB))))
    log = wait_for_log(a, "mem", lambda t: t.count("sha ") >= 2)
    a.checkpoint_to_store("mem", SnapshotTarget("mem-s1", "mem", 1, "manual"), leave_running=False)
    remove_node_dirs(a)
    return b, re.findall(r"sha (\w+)", log)[-1]


def _resident(node: Node, sandbox_id: str, timeout: float = 60) -> float:
    """Wait until the sandbox is no longer busy taking its memory; its resident_ms."""
    deadline = time.monotonic() + timeout
    while node.get(sandbox_id).busy:
        assert time.monotonic() < deadline, "the memory never all arrived"
        time.sleep(0.05)
    return node.get(sandbox_id).record.timings_ms["resident_ms"]


def _intact(node: Node, sandbox_id: str, sha: str) -> None:
    """The sandbox runs on with the memory it had when it was dumped."""
    after = wait_for_log(node, sandbox_id, lambda t: t.count("sha ") >= 3, timeout=60)
    assert set(re.findall(r"sha (\w+)", after)) == {sha}
    assert after.count("start") == 1, "the process started over"


def _slow_store(tmp_path: Path) -> StoreFaults:
    """A store that serves every page the page server reads 50 ms late, so that a transfer is
    still going when the test strikes; set its `page_delay_s` to 0 to speed it up again."""
    return StoreFaults(f"file://{tmp_path}/store", page_delay_s=0.05)


def _gone(node: Node, sandbox_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(s.record.id == sandbox_id for s in node.list()):
        assert time.monotonic() < deadline, f"sandbox {sandbox_id} was not removed"
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_the_sandbox_runs_before_its_memory_arrives(make_node: NodeFactory, tmp_path: Path) -> None:
    b, sha = _snapshot(make_node, tmp_path)
    started = time.monotonic()
    restored = b.restore_from_store("lazy", "mem-s1", recorded(b, "mem-s1"))
    assert restored.busy, "running, with its memory still arriving"
    timings = restored.record.timings_ms
    resident = _resident(b, "lazy")
    assert resident >= timings["restore_ms"] and resident <= (time.monotonic() - started) * 1000
    _intact(b, "lazy", sha)
    assert not staged(b), "the images go once the memory is in"
    with SnapshotStore.open(f"file://{tmp_path}/store") as store:
        memory = max(e.size for e in store.manifest("mem-s1").files() if e.path.startswith("criu/pages-"))
    assert memory > MIB << 20, "the memory came from the store while the sandbox ran"


@pytest.mark.timeout(180)
def test_a_store_error_while_pages_arrive_fails_the_restore_and_spares_the_snapshot(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    faults = StoreFaults(f"file://{tmp_path}/store", pages_before_failure=5)
    b, sha = _snapshot(make_node, tmp_path, store=faults.store)
    try:
        b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1"))
    except StoreUnavailable as exc:  # it failed while the restore was still finishing
        assert "injected" in str(exc)
    _gone(b, "first")
    assert not staged(b)

    faults.pages_before_failure = None
    b.restore_from_store("second", "mem-s1", recorded(b, "mem-s1"))
    _resident(b, "second")
    _intact(b, "second", sha)


def _fail_fetch(store: StoreFaults, runtime: RestoreFaults) -> None:
    store.fetch_fails = True


def _fail_layer_disk(store: StoreFaults, runtime: RestoreFaults) -> None:
    runtime.step = "layer disk"


def _fail_layer(store: StoreFaults, runtime: RestoreFaults) -> None:
    """After the lazy-pages daemon has started, where the layer is unpacked."""
    runtime.step = "after daemon"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", [_fail_fetch, _fail_layer_disk, _fail_layer])
def test_a_restore_that_fails_while_the_sandbox_is_built_leaves_nothing(
    make_node: NodeFactory,
    tmp_path: Path,
    fault: Callable[[StoreFaults, RestoreFaults], None],
) -> None:
    """The fetch, the network and the layer's disk run side by side, and CRIU's daemon starts
    before the layer is made: whichever fails, the rest is undone and the snapshot stays."""
    store, runtime = StoreFaults(f"file://{tmp_path}/store"), RestoreFaults()
    b, sha = _snapshot(make_node, tmp_path, store=store.store, runtime=runtime.runtime)
    fault(store, runtime)
    with pytest.raises((StoreUnavailable, OSError), match="injected"):
        b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1"))
    store.fetch_fails, runtime.step = False, ""
    assert b.list() == []
    assert not staged(b)
    assert not list((b.settings.root / "sandboxes").iterdir())
    assert lazy_daemons(b) == [], "CRIU's lazy-pages daemon was left running"

    b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1"))
    _resident(b, "first")
    _intact(b, "first", sha)


HANGING_CRIU = """#!/bin/sh
# The first restore's `criu swrk` hangs (under runc, on a cgroup v2-only host, its question for
# CRIU's version); later ones and the lazy-pages daemon (`criu lazy-pages`) run.
if [ "$1" = swrk ] && [ ! -e "$0.calls" ]; then
    echo "$$" > "$0.calls"
    exec sleep 1000
fi
exec criu "$@"
"""


@pytest.mark.timeout(30)
def test_a_stopped_daemon_takes_what_it_forked_with_it(tmp_path: Path) -> None:
    """CRIU forks probes of the kernel as it starts, which stop themselves under its ptrace; a
    daemon killed then (a restore that failed at once) left one stopped for good. A shell stands
    in for CRIU here, as that start cannot be timed: it forks a child that stops itself, then
    waits. Stopping the daemon kills both."""
    probe, criu, work = tmp_path / "probe", tmp_path / "criu", tmp_path / "work"
    criu.write_text(f"#!/bin/sh\nsh -c 'echo $$ > {probe}; kill -STOP $$' &\nexec sleep 600\n")
    criu.chmod(0o755)
    work.mkdir()
    memory: Future[dict[int, pagemap.Memory]] = Future()
    server = lazy.PageServer(memory, lambda name: None, lambda message: None)  # type: ignore[arg-type,return-value]
    daemon = lazy.Daemon(str(criu), tmp_path, work, server)
    pid = 0
    try:
        deadline = time.monotonic() + 10
        while not (probe.exists() and probe.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = int(probe.read_text())
        while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
            assert time.monotonic() < deadline, "the probe did not stop itself"
            time.sleep(0.01)
        daemon.stop()
        server.stop()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not Path(f"/proc/{pid}").exists(), "the stopped child outlived the daemon"
    finally:
        daemon.process.kill()
        daemon.process.wait()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_a_restore_that_hangs_is_killed_and_leaves_nothing(make_node: NodeFactory, tmp_path: Path) -> None:
    """A CRIU that never answers is killed at the restore's time limit, and so is whatever it
    left in the sandbox's cgroups (it was placed there first); the mounts and cgroups go too."""
    criu = tmp_path / "hanging-criu"
    criu.write_text(HANGING_CRIU)
    criu.chmod(0o755)
    b, sha = _snapshot(make_node, tmp_path, criu=str(criu))
    b.backend.checkpoints.restore_timeout_s = 5
    with pytest.raises(
        CommandFailed, match=r"CRIU restore of sandbox hung failed \(killed, timed out after 5 s\)"
    ):
        b.restore_from_store("hung", "mem-s1", recorded(b, "mem-s1"))
    assert (tmp_path / "hanging-criu.calls").read_text().strip(), "the restore hung in CRIU"
    assert b.list() == [] and not staged(b)
    assert str(b.settings.root) not in Path("/proc/self/mounts").read_text(), "no mount is left"
    cgroups = [p for p in Path("/sys/fs/cgroup").glob(f"*/stasis/{b.name}/hung") if p.exists()]
    assert cgroups == [], "its cgroups were removed, so nothing was left in them"
    assert subprocess.run(["pgrep", "-f", "^sleep 1000$"], check=False).returncode == 1, "CRIU was killed"

    b.restore_from_store(
        "hung", "mem-s1", recorded(b, "mem-s1")
    )  # the snapshot and the node are as they were
    _resident(b, "hung")
    _intact(b, "hung", sha)


def _cpu_s(pid: int) -> float:
    """The CPU time (user and system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(180)
def test_the_lazy_pages_daemon_waits_for_the_page_server_without_spinning(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """While the page server is slow to answer, CRIU's daemon sleeps until it does (the patch
    `scripts/criu-patches/lazy-pages-wait.patch`); unpatched, it polled for the answer on a whole
    CPU for as long as the memory took to arrive."""
    slow = _slow_store(tmp_path)
    b, sha = _snapshot(make_node, tmp_path, store=slow.store)
    assert b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1")).busy
    (daemon,) = lazy_daemons(b)
    before, started = _cpu_s(daemon), time.monotonic()
    time.sleep(1.0)
    used, elapsed = _cpu_s(daemon) - before, time.monotonic() - started
    assert b.get("first").busy, "the memory was still arriving throughout"
    assert used < 0.2 * elapsed, f"the daemon used {used:.2f} s of CPU in {elapsed:.2f} s of waiting"
    slow.page_delay_s = 0
    _resident(b, "first")
    _intact(b, "first", sha)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("memory_dir", [Path("/dev/shm"), None], ids=["staged-in-memory", "staged-on-disk"])
def test_a_killed_lazy_pages_daemon_removes_the_sandbox(
    make_node: NodeFactory, tmp_path: Path, memory_dir: Path | None
) -> None:
    slow = _slow_store(tmp_path)
    b, sha = _snapshot(make_node, tmp_path, memory_dir=memory_dir, store=slow.store)
    restored = b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1"))
    assert restored.busy
    daemons = lazy_daemons(b)
    assert len(daemons) == 1, "one lazy-pages daemon is running"
    os.kill(daemons[0], signal.SIGKILL)
    _gone(b, "first")

    slow.page_delay_s = 0
    b.restore_from_store("second", "mem-s1", recorded(b, "mem-s1"))
    _resident(b, "second")
    _intact(b, "second", sha)


@pytest.mark.timeout(60)
def test_a_request_the_snapshot_cannot_answer_stops_the_sandbox_first() -> None:
    """The page server answers only from the snapshot; asked for memory it lacks, it stops the
    sandbox before the daemon hears of it."""
    from sandbox_agent.criu import lazy

    stopped: list[str] = []
    memory: Future[dict[int, pagemap.Memory]] = Future()
    memory.set_result({7: pagemap.Memory("pages-1.img", [pagemap.Run(0x10000, 2, 0, True)])})

    class Pages:
        size = 2 * pagemap.PAGE

        def read(self, offset: int, length: int) -> bytes:
            return bytes([offset // pagemap.PAGE + 1]) * length

        def read_views(self, offset: int, length: int) -> list[memoryview]:
            return [memoryview(self.read(offset, length))]

    server = lazy.PageServer(memory, lambda name: Pages(), stopped.append).start()
    daemon = server.theirs
    daemon.sendall(lazy.HEADER.pack(lazy.PS_IOV_GET, 2, 0x11000, 7))
    header = daemon.recv(lazy.HEADER.size, 0)
    cmd, pages, vaddr, _ = lazy.HEADER.unpack(header)
    assert (cmd & 0xFFFF, pages, vaddr) == (lazy.PS_IOV_ADD_F, 1, 0x11000), "only the page the run has"
    body = b""
    while len(body) < pagemap.PAGE:
        body += daemon.recv(pagemap.PAGE)
    assert body == b"\x02" * pagemap.PAGE
    daemon.sendall(lazy.HEADER.pack(lazy.PS_IOV_GET, 1, 0x90000, 7))
    assert server.done.wait(10)
    assert "process 7 has no pages at 0x90000" in server.error
    assert stopped == [server.error], "the sandbox is stopped before the daemon hears"
    server.stop()


@pytest.mark.timeout(180)
def test_an_agent_restarted_while_memory_arrives_removes_the_sandbox(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """The pages still to come were the old agent's to serve: the new one cannot vouch for the
    sandbox's memory, so it removes it, and the control plane restores it again."""
    b, _ = _snapshot(make_node, tmp_path, store=_slow_store(tmp_path).store)
    assert b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1")).busy
    restarted = Node(b.settings)
    assert restarted.list() == []


@pytest.mark.timeout(180)
def test_an_agent_that_stops_while_memory_arrives_removes_the_sandbox_and_its_daemon(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """Its pages would read as zeros without this agent: once `close` has waited its time, the
    sandbox goes, and CRIU's daemon and the page server with it."""
    b, _ = _snapshot(make_node, tmp_path, store=_slow_store(tmp_path).store)
    assert b.restore_from_store("first", "mem-s1", recorded(b, "mem-s1")).busy
    assert len(lazy_daemons(b)) == 1
    b.close(timeout_s=0)
    assert b.list() == []
    assert lazy_daemons(b) == [], "CRIU's lazy-pages daemon was stopped"
    assert not staged(b)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(**numbered: int) -> bytes:
    """A protobuf message of varint fields, given as f<number>=value."""
    return b"".join(_varint(int(k[1:]) << 3) + _varint(v) for k, v in numbered.items())


def _pagemap(*messages: bytes) -> bytes:
    framed = b"".join(struct.pack("<I", len(m)) + m for m in messages)
    return struct.pack("<II", criu_images.IMG_COMMON_MAGIC, pagemap.PAGEMAP_MAGIC) + framed


@pytest.mark.timeout(30)
def test_pagemap_images_read_as_criu_writes_them(tmp_path: Path) -> None:
    present, lazy_flag = pagemap.PE_PRESENT, pagemap.PE_LAZY
    (tmp_path / "pagemap-42.img").write_bytes(
        _pagemap(
            _fields(f1=3),  # the head: pages-3.img
            _fields(f1=0x400000, f2=2, f4=present, f5=2),
            _fields(f1=0x7F0000000000, f2=0, f4=present | lazy_flag, f5=1 << 20),  # 4 GiB
            _fields(f1=0x7F1000000000, f2=4),  # an older image: no flags, compat_nr_pages alone
            _fields(f1=0x7F2000000000, f2=0, f4=lazy_flag, f5=8),  # not present: no data
        )
    )
    (tmp_path / "pagemap-shmem-7.img").write_bytes(_pagemap(_fields(f1=9)))
    tasks, others = pagemap.memories(tmp_path)
    assert others == {"pages-9.img"}
    memory = tasks[42]
    assert memory.pages_file == "pages-3.img"
    assert [(r.vaddr, r.pages, r.offset, r.lazy) for r in memory.runs] == [
        (0x400000, 2, 0, False),
        (0x7F0000000000, 1 << 20, 2 * pagemap.PAGE, True),
        (0x7F1000000000, 4, (2 + (1 << 20)) * pagemap.PAGE, False),
    ]
    (tmp_path / "pagemap-42.img").write_bytes(_pagemap(_fields(f1=3), _fields(f1=1, f5=2))[:-1])
    with pytest.raises(ValueError, match=r"pagemap-42\.img is damaged"):
        pagemap.memories(tmp_path)
    (tmp_path / "pagemap-42.img").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"pagemap-42\.img is not the CRIU image its name says"):
        pagemap.memories(tmp_path)


@pytest.mark.timeout(30)
def test_pages_are_aligned_with_the_parents_by_address(tmp_path: Path) -> None:
    """A mapping new since the parent moves every page after it in the pages file; the store is
    told where each page sat, so that it is stored against its own earlier bytes."""
    page, present = pagemap.PAGE, pagemap.PE_PRESENT | pagemap.PE_LAZY
    a, b, new, stack = 0x400000, 0x7F0000000000, 0x100000, 0x7FFF00000000
    parent = _pagemap(
        _fields(f1=1),
        _fields(f1=a, f4=present, f5=4),
        _fields(f1=b, f4=present, f5=8),
        _fields(f1=stack, f4=pagemap.PE_PRESENT, f5=2),  # eager: CRIU restores it itself
    )
    (tmp_path / "criu").mkdir()
    (tmp_path / "criu" / "pagemap-1.img").write_bytes(
        _pagemap(
            _fields(f1=2),
            _fields(f1=new, f4=present, f5=2),
            _fields(f1=a, f4=present, f5=4),
            _fields(f1=b - 2 * page, f4=present, f5=10),  # grew downwards by two pages
            _fields(f1=stack, f4=pagemap.PE_PRESENT, f5=2),  # eager
        )
    )
    (tmp_path / "criu" / "pagemap-7.img").write_bytes(
        _pagemap(_fields(f1=3), _fields(f1=a, f4=present, f5=1))
    )
    asked: list[str] = []

    def read(path: str) -> bytes | None:
        asked.append(path)
        return parent if path == "criu/pagemap-1.img" else None  # process 7 is new

    assert pagemap.align_memory(tmp_path, read) == {
        "criu/pages-2.img": Alignment(
            "criu/pages-1.img",
            [
                Segment(2 * page, 0, 4 * page),
                Segment(8 * page, 4 * page, 8 * page),
                Segment(16 * page, 12 * page, 2 * page),
            ],
        )
    }
    assert sorted(asked) == ["criu/pagemap-1.img", "criu/pagemap-7.img"]
    with pytest.raises(ValueError, match=r"the parent's criu/pagemap-1\.img is damaged"):
        pagemap.align_memory(tmp_path, lambda path: parent[:-1])


def test_what_a_restore_reads_itself_is_read_in_bounded_pieces() -> None:
    """A sandbox decides how much memory CRIU restores itself (gigabytes of shared memory, say):
    `prepare` holds at most PREPARE_BATCH_BYTES of it at once, and writes every byte once."""
    limit = 1000
    ranges = [(0, 10), (4096, 2500), (9000, 0), (20000, 999), (30000, 1)]
    batches = list(lazy._batches(ranges, limit))
    assert all(sum(n for _, n in batch) <= limit for batch in batches)
    covered = [byte for batch in batches for start, n in batch for byte in range(start, start + n)]
    assert covered == [byte for start, n in ranges for byte in range(start, start + n)]
    assert list(lazy._batches([(0, 64)])) == [[(0, 64)]], "a sandbox's few eager pages: one read, as before"
