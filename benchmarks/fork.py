"""`make bench`, forks: N children of one snapshot, beside one lazy restore of it, in one run.

    .venv/bin/python benchmarks/fork.py [--sizes 64,512] [--children 1,4,8,16]

For each size a program holds that much random memory (bench.py's PROGRAM, incompressible) on
node a; the agent takes a leave-running snapshot of it into a local store. Then, on nodes b and c
(both lazy, as a cluster's nodes are), on the same host:

- baseline_restore_ms: one lazy restore of that snapshot, with an address of its own, until
  it runs; baseline_cpu_ms, the CPU time it took (the agent's and its tools', CRIU's and runc's);
- for each N: N fork children restored at once, alternately on b and c, each with its own
  address, host name and ForkMark (`Identity`), as the orchestrator places them:
  all_running_ms (until the last runs) and its ratio to the baseline; cpu_floor_ms, N times the
  baseline's CPU time over the host's cores, below which no N restores on this host can finish,
  and the ratio to that;
  children_rss_mib (the children's programs' resident sets and their CRIU daemons', summed, after
  a second idle) and its ratio to the parent's resident set;
  all_whole_ms (from releasing the children's held memory until every child has all of it, what a
  checkpoint of each waits for first).

Writes bench/fork.json and bench/fork.png (each figure against its target) and prints a table.
The children are idle: they touch no page after the fork, so what they hold is what a fork child
takes on its own (its memory held, `lazy.Transfer(hold=True)`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import PROGRAM, ROOT, _ms, _python_child, _wait, machine

sys.path.insert(0, str(ROOT))
from sandbox_agent import AgentSettings, Node, Resources, SandboxSpec
from sandbox_agent.node import ForkMark, Identity, SnapshotTarget
from snapshots import set_aside_startup_objects


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _resident(node: Node, sandbox_id: str) -> None:
    while node.get(sandbox_id).busy:  # its memory is still arriving
        time.sleep(0.005)


def daemons_rss_mib() -> float:
    """The resident sets of every CRIU lazy-pages daemon on the host, summed."""
    held = 0.0
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if proc.name.isdigit() and argv[1:2] == [b"lazy-pages"]:
                held += rss_mib(int(proc.name))
        except OSError:  # gone
            continue
    return held


def cpu_s() -> float:
    """CPU time of this process and of the children it reaped (runc, and CRIU under it)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def run(size: int, counts: list[int], a: Node, b: Node, c: Node) -> dict[str, Any]:
    parent = f"bench-fork-{size}"
    spec = SandboxSpec(
        image="base",
        command=("python3", "-c", PROGRAM, str(size), "incompressible"),
        address="10.254.0.2",
        resources=Resources(memory_mb=size * 2 + 512, disk_mb=512),
    )
    a.create(parent, spec)
    _wait(lambda: a.harness_log(parent, 1 << 16).decode(errors="replace"), "ready")
    parent_rss = rss_mib(_python_child(a.get(parent).pid))
    snapshot = f"{parent}-s1"
    _, manifest = a.checkpoint_to_store(
        parent, SnapshotTarget(snapshot, parent, 1, "fork"), leave_running=True
    )

    started, cpu = time.perf_counter(), cpu_s()
    b.restore_from_store("bench-base", snapshot, manifest.digest, identity=Identity(address="10.254.0.3"))
    baseline_ms, baseline_cpu_ms = _ms(started), round((cpu_s() - cpu) * 1000, 1)
    _resident(b, "bench-base")
    b.delete("bench-base")

    entry: dict[str, Any] = {
        "size_mib": size, "parent_rss_mib": round(parent_rss, 1), "baseline_restore_ms": baseline_ms,
        "baseline_cpu_ms": baseline_cpu_ms, "forks": [],
    }  # fmt: skip
    for n in counts:
        children = [(f"bench-child-{n}-{i}", b if i % 2 == 0 else c) for i in range(n)]

        def restore(i: int, child: str, node: Node, count: int) -> float:
            identity = Identity(
                address=f"10.254.1.{10 + i}",
                hostname=f"child-{i}",
                fork=ForkMark(child, parent, snapshot, i, count),
            )
            node.restore_from_store(child, snapshot, manifest.digest, identity=identity)
            return time.perf_counter()

        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            done = [pool.submit(restore, i, child, node, n) for i, (child, node) in enumerate(children)]
            running = max(f.result() for f in done)
        all_running_ms = round((running - started) * 1000, 1)
        time.sleep(1.0)  # idle
        held = sum(rss_mib(_python_child(node.get(child).pid)) for child, node in children)
        held += daemons_rss_mib()
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda pair: pair[1].arrivals.settle(pair[0]), children))
        all_whole_ms = _ms(started)
        for child, node in children:
            node.delete(child)
        floor_ms = n * baseline_cpu_ms / (os.cpu_count() or 1)
        fork = {
            "children": n,
            "all_running_ms": all_running_ms,
            "running_vs_one_restore": round(all_running_ms / baseline_ms, 2),
            "cpu_floor_ms": round(floor_ms, 1),
            "running_vs_cpu_floor": round(all_running_ms / floor_ms, 2),
            "children_rss_mib": round(held, 1),
            "rss_vs_parent": round(held / parent_rss, 2),
            "all_whole_ms": all_whole_ms,
        }
        entry["forks"].append(fork)
        print(json.dumps({"size_mib": size, **fork}), flush=True)
    a.delete(parent)
    return entry


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'size':>6} {'N':>3} {'running ms':>11} {'x 1 restore':>12} {'x CPU floor':>12} {'RSS MiB':>8}"
        f" {'x parent':>9} {'whole ms':>9}"
    ]
    for r in results:
        lines.append(
            f"{r['size_mib']:>6} {'1r':>3} {r['baseline_restore_ms']:>11} {'1.00':>12}"
            f" {'(' + str(r['baseline_cpu_ms']) + ' ms CPU)':>12}"
        )
        for f in r["forks"]:
            lines.append(
                f"{r['size_mib']:>6} {f['children']:>3} {f['all_running_ms']:>11} {f['running_vs_one_restore']:>12}"
                f" {f['running_vs_cpu_floor']:>12} {f['children_rss_mib']:>8} {f['rss_vs_parent']:>9}"
                f" {f['all_whole_ms']:>9}"
            )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Time until all N children run, and their resident sets, each against its baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for r in results:
        n = [f["children"] for f in r["forks"]]
        axes[0].plot(n, [f["running_vs_one_restore"] for f in r["forks"]], "-o", label=f"{r['size_mib']} MiB")
        axes[1].plot(n, [f["rss_vs_parent"] for f in r["forks"]], "-o", label=f"{r['size_mib']} MiB")
    for ax, label, target in (
        (axes[0], "all running, x one lazy restore", 2.0),
        (axes[1], "children's RSS, x the parent's", 4.0),
    ):
        ax.axhline(target, color="grey", linestyle=":", label=f"target {target:g}x")
        ax.set(
            xlabel="children",
            ylabel=label,
            xscale="log",
            xticks=[1, 4, 8, 16],
            xticklabels=["1", "4", "8", "16"],
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,512")
    p.add_argument("--children", default="1,4,8,16")
    p.add_argument("--out", type=Path, default=ROOT / "bench")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the clean-up below runs
    work = Path(tempfile.mkdtemp(prefix="stasis-bench-fork-", dir="/var/tmp"))
    store = f"file://{work}/store"
    nodes = [Node(AgentSettings(node=f"bench-{n}", root=work / n, snapshot_store=store)) for n in "abc"]
    for node in nodes:
        node.warm()
    set_aside_startup_objects()
    results: list[dict[str, Any]] = []
    try:
        for size in (int(s) for s in args.sizes.split(",") if s):
            results.append(run(size, [int(n) for n in args.children.split(",") if n], *nodes))
    finally:
        for node in nodes:
            node.delete_all()
            node.close()
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fork.json").write_text(
        json.dumps({"machine": machine(), "results": results}, indent=1) + "\n"
    )
    plot(results, args.out / "fork.png")
    print(table(results))
    print(f"wrote {args.out / 'fork.json'} and {args.out / 'fork.png'}")


if __name__ == "__main__":
    main()
