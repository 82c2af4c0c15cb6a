"""`make bench`: Stasis beside raw CRIU and Docker's own checkpoints, on the same workload, in one run.

    .venv/bin/python benchmarks/bench.py [--sizes 64,512,2048] [--memory compressible,incompressible]
                                         [--systems stasis,criu,docker] [--drain 64] [--submits 2000]

For every (system, size, memory kind) one program holds that much memory: random bytes
(incompressible) or a Python heap of small dicts and strings (compressible). Each system takes
two leave-running snapshots of it, with a tenth of the memory rewritten after each (random bytes:
10% of the pages; the heap: a tenth of its objects replaced, which changes 12-13% of its pages,
scattered in small clusters, and so about a fifth of its 64 KiB chunks). Then come three
preemptions: a stopping snapshot, restored (Stasis and raw CRIU) before the next is taken. Their
medians are reported, and each in frozen_each_ms, node_free_each_ms, durable_each_ms and
restored_running_each_ms; Docker is preempted once. Before each stopping snapshot every system
gets a `sync`, so none pays for writing back what the earlier ones left dirty (raw CRIU and
Docker delete their earlier images once sized, as a Stasis node deletes its staging once stored).
What each system does:

- stasis: the agent's `checkpoint_to_store` into a local snapshot store, restored with
  `restore_from_store` on a second node: lazily (the small images, the layer, CRIU's lazy
  restore over its RPC; the memory follows from the store as the program runs). The first
  preemption's snapshot is then restored eagerly on a third node (fetch and verify everything
  first), as the baseline of the lazy restore: eager_restored_running_ms.
- criu: `criu dump` and `criu restore -d` of the same program as a plain host process: the floor.
- docker: `docker checkpoint create` and `docker start --checkpoint` on a dockerd in experimental
  mode, restored into the same container (Docker's own flow; nothing is moved).

Figures per entry: frozen_ms (from the start of the freeze to the kill, as CRIU measures it in
its stats-dump; Docker: the whole `docker checkpoint create`), node_free_ms (until the processes
are gone and the runtime has returned), durable_ms (until the snapshot is committed, or for CRIU and Docker
its images fsynced), restored_running_ms (until the restored process runs), resident_ms (until
every page is local: for raw CRIU and Docker the same, as they restore eagerly), stored_bytes
(the first snapshot), new_bytes_2nd and new_bytes_3rd (what the later ones add).

Also: idle_sandbox_mib and density_64mib (the node memory one idle 64 MiB sandbox takes, and how
many fit in what the node has available), saved_in_30s_64mib (how many 64 MiB sandboxes a node saves
within a 30 s spot notice, at the drain's measured pace), drain_64_s (stopping checkpoints of 64 idle 64 MiB sandboxes on one node, eight at a time
as the orchestrator's workers do: until the node is free, and until all are durable) and
submits_per_s (durable submits per second, in SubmitEpisodes calls of 64; submits_per_s_20k_waiting
the same with 20,000 episodes waiting already; single_submits_per_s
with one SubmitEpisode call each). Writes bench/results.json and
bench/results.png, and prints a table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from control_plane import submit_throughput

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's own Docker Engine
from sandbox_agent import AgentSettings, Node, Phase, PhaseHooks, Resources, SandboxSpec
from sandbox_agent.criu import stats
from sandbox_agent.node import SnapshotTarget
from sandbox_agent.settings import DEFAULT_BASE_IMAGE_TAR
from snapshots import set_aside_startup_objects
from tests.dockerd import docker
from tests.dockerd import engine as docker_engine

ROOT = Path(__file__).resolve().parent.parent
DOCKER_ROOT = Path("/var/lib/stasis-bench-docker")
DOCKER_EXEC_ROOT = Path("/run/stasis-bench-docker")
DOCKER_SOCKET = DOCKER_EXEC_ROOT.with_suffix(".sock")
DOCKER_HOST = f"unix://{DOCKER_SOCKET}"
DOCKER_IMAGE = "stasis-bench-base:latest"

PROGRAM = r"""
import os, random, signal, sys, time
size, kind = int(sys.argv[1]) << 20, sys.argv[2]
rng, MIB = random.Random(7), 1 << 20

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

if kind == "incompressible":
    buf = bytearray(size)
    for off in range(0, size, 16 * MIB):
        buf[off:off + 16 * MIB] = rng.randbytes(min(16 * MIB, size - off))

    def mutate(n):
        r = random.Random(n)
        for _ in range(max(1, size // MIB // 10)):
            off = r.randrange(0, size - MIB)
            buf[off:off + MIB] = r.randbytes(MIB)
else:
    heap = []

    def item(i, salt):
        return {"step": i, "text": f"observation {i % 977} of run {salt}", "tags": ["tool", str(i % 31)]}

    while rss() < size:
        heap.extend(item(i, 0) for i in range(len(heap), len(heap) + 50_000))

    def mutate(n):
        count = len(heap) // 10
        start = random.Random(n).randrange(0, len(heap) - count)
        heap[start:start + count] = [item(i, n) for i in range(start, start + count)]

asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
print("ready", rss() >> 20, flush=True)
done = 0
while True:
    if len(asked) > done:
        done += 1
        mutate(done)
        print("mutated", done, flush=True)
    time.sleep(0.02)
"""


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _wait(read: Callable[[], str], text: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in read():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never saw {text!r}; output: {read()[-500:]}")
        time.sleep(0.05)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _settle() -> None:
    """Write back what earlier snapshots left dirty, so the timed one does not pay for it."""
    os.sync()


def _python_child(init_pid: int) -> int:
    """The program's pid under a sandbox's init (the agent's `sh` wrapper)."""
    for _ in range(100):
        children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise RuntimeError(f"pid {init_pid} has no child")


def _mutate(pid: int, n: int, read: Callable[[], str]) -> None:
    os.kill(pid, signal.SIGUSR1)
    _wait(read, f"mutated {n}")


def _entry(system: str, size: int, memory: str, **figures: float | list[float]) -> dict[str, Any]:
    return {"system": system, "size_mib": size, "memory": memory, **figures}


def _preemptions(frozen: list[float], free: list[float], durable: list[float]) -> dict[str, Any]:
    """The medians of the stopping snapshots' figures, and each of them."""
    figures: dict[str, Any] = {}
    for key, each in (("frozen_ms", frozen), ("node_free_ms", free), ("durable_ms", durable)):
        figures[key] = statistics.median(each)
        figures[key.replace("_ms", "_each_ms")] = each
    return figures


PREEMPTIONS = 3
"""Stopping snapshots of each program, each restored (Stasis's lazily, on the second node) before
the next: the medians are reported, since one freeze or restore on this noisy machine varies by
15% and more."""
PR_SET_CHILD_SUBREAPER = 36
libc = ctypes.CDLL(None, use_errno=True)


# -- the three systems --------------------------------------------------------------------------


def run_criu(size: int, memory: str, work: Path) -> dict[str, Any]:
    work.mkdir()
    out = work / "out.log"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            ["python3", "-c", PROGRAM, str(size), memory],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    read = out.read_text
    _wait(read, "ready")

    def dump(name: str, *extra: str) -> tuple[Path, float]:
        images = work / name
        images.mkdir()
        started = time.perf_counter()
        subprocess.run(
            ["criu", "dump", "-t", str(proc.pid), "-D", str(images), "-o", "dump.log", *extra], check=True
        )
        return images, _ms(started)

    sizes = []
    for n in (1, 2):
        images, _ = dump(f"s{n}", "--leave-running")
        sizes.append(_du(images))
        shutil.rmtree(images)
        _mutate(proc.pid, n, read)
    frozen, free, durable, restores = [], [], [], []
    # The restored program is CRIU's child, then ours (a subreaper's), so that it can be reaped
    # and its pid, which every restore gives it again, is free for the next.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        for k in range(PREEMPTIONS):
            _settle()
            started = time.perf_counter()
            images, dump_ms = dump(f"s{3 + k}")
            # As for Stasis, CRIU's own measure of the freeze (its work dir is the images dir here).
            frozen.append(stats.frozen_ms(images) or dump_ms)
            free.append(dump_ms)
            _fsync_tree(images)
            durable.append(_ms(started))
            os.waitpid(proc.pid, 0)  # the program, killed by the dump
            if k == 0:
                third = _du(images)
            started = time.perf_counter()
            subprocess.run(["criu", "restore", "-d", "-D", str(images), "-o", "restore.log"], check=True)
            restores.append(_ms(started))
            shutil.rmtree(images)
        os.kill(proc.pid, signal.SIGKILL)
        os.waitpid(proc.pid, 0)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0)
    restored_ms = statistics.median(restores)
    return _entry(
        "criu", size, memory, **_preemptions(frozen, free, durable),
        restored_running_ms=restored_ms, resident_ms=restored_ms, restored_running_each_ms=restores,
        stored_bytes=sizes[0], new_bytes_2nd=sizes[1], new_bytes_3rd=third,
    )  # fmt: skip


def run_stasis(size: int, memory: str, a: Node, b: Node, eager: Node) -> dict[str, Any]:
    sid = f"bench-{size}-{memory[:1]}"
    spec = SandboxSpec(
        image="base",
        command=("python3", "-c", PROGRAM, str(size), memory),
        address="10.254.0.2",
        resources=Resources(memory_mb=size * 2 + 512),
    )
    a.create(sid, spec)

    def read() -> str:
        return a.harness_log(sid, 1 << 16).decode(errors="replace")

    _wait(read, "ready")
    pid = _python_child(a.get(sid).pid)
    manifests = []
    for n in (1, 2):
        target = SnapshotTarget(f"{sid}-s{n}", sid, n, "autosave", parent_id=f"{sid}-s1" if n > 1 else "")
        manifests.append(a.checkpoint_to_store(sid, target, leave_running=True)[1])
        _mutate(pid, n, read)
    frozen, free, durable, restores = [], [], [], []
    on = a
    for n in range(3, 3 + PREEMPTIONS):
        _settle()
        target = SnapshotTarget(f"{sid}-s{n}", sid, n, "time-slice", parent_id=f"{sid}-s{n - 1}")
        captured, manifest = on.checkpoint_to_store(sid, target, leave_running=False)
        manifests.append(manifest)
        # CRIU's own measure, from its freeze until it killed the tasks; the node is free once
        # CRIU returns.
        frozen.append(captured.timings_ms["frozen_ms"])
        free.append(captured.timings_ms["node_free_ms"])
        durable.append(captured.timings_ms["durable_ms"])
        started = time.perf_counter()
        b.restore_from_store(sid, f"{sid}-s{n}", manifest.digest)
        restored_ms = _ms(started)
        while b.get(sid).busy:  # its memory is still arriving
            time.sleep(0.002)
        # Measured by the node, from the start of the restore to the last page.
        phases = b.get(sid).record.timings_ms
        restores.append((restored_ms, phases.get("resident_ms", restored_ms), phases))
        on = b
    b.delete(sid)
    # The median restore (by its time until running), with its own time until resident.
    restored_ms, resident_ms, phases = sorted(restores, key=lambda r: r[0])[len(restores) // 2]
    started = time.perf_counter()
    eager.restore_from_store(sid, f"{sid}-s3", manifests[2].digest)
    eager_ms = _ms(started)
    eager.delete(sid)
    return _entry(
        "stasis", size, memory, **_preemptions(frozen, free, durable),
        restored_running_ms=restored_ms, resident_ms=resident_ms,
        restored_running_each_ms=[r[0] for r in restores],
        eager_restored_running_ms=eager_ms, lazy_fetch_ms=phases.get("fetch_ms", 0.0),
        lazy_restore_ms=phases.get("restore_ms", 0.0), stored_bytes=manifests[0].sizes.stored_bytes,
        new_bytes_2nd=manifests[1].sizes.new_bytes, new_bytes_3rd=manifests[2].sizes.new_bytes,
    )  # fmt: skip


def _docker(*args: str, check: bool = True) -> str:
    return docker(DOCKER_HOST, *args, check=check).stdout.strip()


def _docker_checkpoint(name: str, checkpoint: str, *, leave_running: bool) -> float:
    """Milliseconds `docker checkpoint create` takes. Docker refuses a checkpoint ("content …
    already exists") while containerd still holds blobs of the container's last one, so they are
    removed first, untimed."""
    ctr = ["ctr", "--address", f"{DOCKER_EXEC_ROOT}/containerd/containerd.sock", "-n", "stasis-bench"]
    held = subprocess.run([*ctr, "content", "ls", "-q"], capture_output=True, text=True, check=True)
    if held.stdout.split():
        subprocess.run([*ctr, "content", "rm", *held.stdout.split()], capture_output=True, check=True)
    started = time.perf_counter()
    _docker("checkpoint", "create", f"--leave-running={str(leave_running).lower()}", name, checkpoint)
    return _ms(started)


def run_docker(size: int, memory: str) -> dict[str, Any]:
    name = f"stasis-bench-{size}-{memory}"
    _docker("rm", "-f", name, check=False)  # left by an interrupted run
    cid = _docker("run", "-d", "--name", name, "--network", "none", DOCKER_IMAGE,
                  "python3", "-c", PROGRAM, str(size), memory)  # fmt: skip
    checkpoints = DOCKER_ROOT / "containers" / cid / "checkpoints"
    try:

        def read() -> str:
            return _docker("logs", name, check=False)

        _wait(read, "ready")
        pid = int(_docker("inspect", "-f", "{{.State.Pid}}", name))
        sizes = []
        for n in (1, 2):
            _docker_checkpoint(name, f"s{n}", leave_running=True)
            sizes.append(_du(checkpoints / f"s{n}"))
            _docker("checkpoint", "rm", name, f"s{n}")
            _mutate(pid, n, read)
        _settle()
        dump_ms = _docker_checkpoint(name, "s3", leave_running=False)
        started = time.perf_counter()
        _fsync_tree(checkpoints / "s3")
        durable_ms = dump_ms + _ms(started)
        # Docker refuses to restore images whose tar containerd still holds from the dump.
        (checkpoints / "s3" / "stasis-restore").write_text(uuid.uuid4().hex)
        started = time.perf_counter()
        _docker("start", "--checkpoint", "s3", name)
        restored_ms = _ms(started)
        return _entry(
            "docker", size, memory, frozen_ms=dump_ms, node_free_ms=dump_ms, durable_ms=durable_ms,
            restored_running_ms=restored_ms, resident_ms=restored_ms,
            stored_bytes=sizes[0], new_bytes_2nd=sizes[1], new_bytes_3rd=_du(checkpoints / "s3"),
        )  # fmt: skip
    finally:
        _docker("rm", "-f", name, check=False)


@contextmanager
def dockerd() -> Iterator[None]:
    """A Docker Engine in experimental mode on its own socket and roots, with the base image."""
    with docker_engine(DOCKER_SOCKET, DOCKER_ROOT, DOCKER_EXEC_ROOT, "stasis-bench", experimental=True):
        if not _docker("images", "-q", DOCKER_IMAGE):
            _docker("import", str(DEFAULT_BASE_IMAGE_TAR), DOCKER_IMAGE)
        yield


# -- drain and submits --------------------------------------------------------------------------


def _available_mib() -> float:
    found = re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text())
    assert found, "no MemAvailable in /proc/meminfo"
    return int(found.group(1)) / 1024


def drain(count: int, size: int, a: Node, freed: dict[str, float]) -> tuple[float, float, float]:
    """Seconds until `count` idle sandboxes of `size` MiB are all stopped, and all durable; and the
    node memory (MiB) one of them takes while idle, from MemAvailable before and after.

    `freed` is filled by node a's NODE_FREE hook with the moment each sandbox's processes were gone.
    """
    available = _available_mib()
    spec = SandboxSpec(
        image="base",
        command=("python3", "-c", PROGRAM, str(size), "incompressible"),
        resources=Resources(memory_mb=size * 2 + 256),
    )
    ids = [f"drain-{i}" for i in range(count)]
    for i, sid in enumerate(ids):
        a.create(sid, replace(spec, address=f"10.254.{1 + i // 200}.{2 + i % 200}"))
    for sid in ids:
        _wait(lambda sid=sid: a.harness_log(sid, 4096).decode(errors="replace"), "ready")
    footprint = (available - _available_mib()) / count
    started = time.perf_counter()

    def stop(sid: str) -> None:
        a.checkpoint_to_store(sid, SnapshotTarget(f"{sid}-s1", sid, 1, "drain"), leave_running=False)

    with ThreadPoolExecutor(8) as pool:  # the orchestrator's checkpoint workers
        list(pool.map(stop, ids))
    durable_s = time.perf_counter() - started
    return max(freed[sid] for sid in ids) - started, durable_s, footprint


# -- report --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    def version(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True).stdout
        except FileNotFoundError:
            return "absent"
        return out.strip().splitlines()[0] if out.strip() else "unknown"

    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "kernel": platform.release(),
        "criu": version(["criu", "--version"]),
        "runc": version(["runc", "--version"]),
        "docker": version(["docker", "--version"]),
        "python": platform.python_version(),
    }


COLUMNS = ("frozen_ms", "node_free_ms", "durable_ms", "restored_running_ms", "resident_ms")


def table(results: list[dict[str, Any]]) -> str:
    head = f"{'system':<7} {'size':>6} {'memory':<14}" + "".join(f"{c[:-3]:>17}" for c in COLUMNS)
    head += f"{'stored':>10} {'new 2nd':>9} {'new 3rd':>9}"
    lines = [head]
    floor = {(r["size_mib"], r["memory"]): r for r in results if r["system"] == "criu"}
    for r in results:
        base = floor.get((r["size_mib"], r["memory"]))
        cells = ""
        for c in COLUMNS:
            ratio = f" ({r[c] / base[c]:.2f}x)" if base and base[c] else ""
            cells += f"{r[c]:>9.0f}{ratio:>8}"
        mib = 1 << 20
        lines.append(
            f"{r['system']:<7} {r['size_mib']:>4}Mi {r['memory']:<14}{cells}"
            f"{r['stored_bytes'] / mib:>8.0f}Mi {r['new_bytes_2nd'] / mib:>7.0f}Mi {r['new_bytes_3rd'] / mib:>7.0f}Mi"
        )
    lines.append("\nStasis restores, lazy beside eager (the same snapshot, fetched whole first):")
    for r in results:
        if "eager_restored_running_ms" in r:
            eager = r["eager_restored_running_ms"]
            lines.append(
                f"{r['size_mib']:>5}Mi {r['memory']:<14} running {r['restored_running_ms']:>6.0f} ms"
                f" ({r['restored_running_ms'] / eager:.2f}x eager), resident {r['resident_ms']:>6.0f} ms,"
                f" eager {eager:>6.0f} ms"
            )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    measures = (("frozen_ms", "frozen (ms)"), ("restored_running_ms", "restored and running (ms)"))
    styles = {"stasis": "-o", "criu": "--s", "docker": ":^"}
    for ax, (key, label) in zip(axes, measures, strict=False):
        for system in styles:
            for memory in sorted({r["memory"] for r in results}):
                rows = sorted((r for r in results if r["system"] == system and r["memory"] == memory),
                              key=lambda r: r["size_mib"])  # fmt: skip
                if rows:
                    ax.plot([r["size_mib"] for r in rows], [r[key] for r in rows], styles[system],
                            label=f"{system}, {memory}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="sandbox memory (MiB)", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
    ax = axes[2]
    stasis = [r for r in results if r["system"] == "stasis"]
    names = [f"{r['size_mib']} {r['memory'][:6]}" for r in stasis]
    for i, key in enumerate(("stored_bytes", "new_bytes_2nd", "new_bytes_3rd")):
        ax.bar([x + i * 0.27 for x in range(len(stasis))], [r[key] / 2**20 for r in stasis], 0.27, label=key)
    ax.set_xticks([x + 0.27 for x in range(len(stasis))], names, rotation=30, fontsize=8)
    ax.set(ylabel="Stasis snapshot bytes (MiB)")
    axes[0].legend(fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,512,2048")
    p.add_argument("--memory", default="compressible,incompressible")
    p.add_argument("--systems", default="stasis,criu,docker")
    p.add_argument("--drain", type=int, default=64, help="sandboxes of 64 MiB to drain; 0 skips")
    p.add_argument("--submits", type=int, default=2000, help="submits to time; 0 skips")
    p.add_argument("--out", type=Path, default=ROOT / "bench")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the clean-up below runs
    sizes = [int(s) for s in args.sizes.split(",") if s]
    kinds = args.memory.split(",")
    systems = args.systems.split(",")
    work = Path(tempfile.mkdtemp(prefix="stasis-bench-", dir="/var/tmp"))
    store = f"file://{work}/store"
    freed: dict[str, float] = {}

    def note_free(phase: Phase, sandbox_id: str, _ms: float) -> None:
        if phase == Phase.NODE_FREE:
            freed[sandbox_id] = time.perf_counter()

    a = Node(
        AgentSettings(node="bench-a", root=work / "a", snapshot_store=store),
        hooks=PhaseHooks(after=note_free),
    )
    b = Node(AgentSettings(node="bench-b", root=work / "b", snapshot_store=store))
    c = Node(AgentSettings(node="bench-c", root=work / "c", snapshot_store=store, lazy_restore=False))
    for node in (a, b, c):
        node.warm()  # as the agent does when it starts
    set_aside_startup_objects()  # as the agent does once it serves
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"machine": machine(), "results": results}
    try:
        with dockerd() if "docker" in systems else _nothing():
            for size in sizes:
                for memory in kinds:
                    for system in systems:
                        if system == "stasis":
                            entry = run_stasis(size, memory, a, b, c)
                        elif system == "criu":
                            entry = run_criu(size, memory, work / f"criu-{size}-{memory}")
                            shutil.rmtree(work / f"criu-{size}-{memory}")
                        else:
                            entry = run_docker(size, memory)
                        results.append(entry)
                        print(json.dumps(entry), flush=True)
                        _write(args.out, report)
        if args.drain:
            free_s, durable_s, footprint = drain(args.drain, 64, a, freed)
            report[f"drain_{args.drain}_s"] = round(free_s, 2)
            report[f"drain_{args.drain}_durable_s"] = round(durable_s, 2)
            # A spot node's notice: GCP gives 30 s. At this drain's pace, how many 64 MiB sandboxes
            # one node saves (durable in the store) before it goes.
            report["saved_in_30s_64mib"] = int(30 * args.drain / durable_s)
            # Density: how many such idle sandboxes fit in the memory this node has, at that footprint.
            report["idle_sandbox_mib"] = round(footprint, 1)
            report["density_64mib"] = int(_available_mib() // footprint)
        if args.submits:
            # Rollout groups of 64 in one SubmitEpisodes call each, as a GRPO trainer sends them;
            # and one SubmitEpisode call per episode from 16 threads.
            report["submits_per_s"] = round(submit_throughput(work, args.submits, threads=4, batch=64), 1)
            report["single_submits_per_s"] = round(submit_throughput(work, args.submits, threads=16), 1)
            # The same groups into a state where 20,000 episodes wait already.
            report["submits_per_s_20k_waiting"] = round(
                submit_throughput(work, args.submits, threads=4, batch=64, waiting=20_000), 1
            )
    finally:
        for node in (a, b, c):
            node.delete_all()
            node.close()
        shutil.rmtree(work, ignore_errors=True)
    _write(args.out, report)
    plot(results, args.out / "results.png")
    print(table(results))
    extras = {k: v for k, v in report.items() if k not in ("results", "machine")}
    print(json.dumps(extras), "\nmachine:", json.dumps(report["machine"]))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.png'}")


def _write(out: Path, report: dict[str, Any]) -> None:
    """results.json as it stands: written after every entry, so an interrupted run keeps its figures."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    main()
