"""Control-plane cost: submit throughput of the gRPC API, what one preempt + resume costs
beyond the runtime's own checkpoint and restore, and what one tick of the control loop reads and
plans with a long queue, measured in one run.

    .venv/bin/python benchmarks/control_plane.py [--submits 600] [--cycles 5] [--queued 1000,10000,50000]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator import StasisClient
from orchestrator.cli.local import LocalSettings, LocalStack, free_port
from orchestrator.client import Context
from orchestrator.control import scheduler
from orchestrator.control.settings import ControlSettings
from orchestrator.domain import EpisodeSpec, EpisodeState, NodeRecord, NodeState, Resources, ids
from orchestrator.state import SqliteStateStore
from sandbox_agent import AgentSettings, Node

STASIS = str(Path(sys.executable).with_name("stasis"))
SPEC = {"image": "base", "command": ["sleep", "3600"], "resources": {"memory_mb": 256}}
EPISODE = EpisodeSpec(image="base", command=("sleep", "3600"), resources=Resources(memory_mb=256))
"""SPEC as the state store takes it, to fill a state with waiting episodes."""


def _fill(store: SqliteStateStore, count: int, pool: str) -> None:
    """Submit `count` more EPISODEs to `store`, a thousand to a commit."""
    for start in range(0, count, 1000):
        store.episodes.submit_many([(EPISODE, "")] * min(1000, count - start), ids.address_pool(pool))


def submit_throughput(root: Path, submits: int, threads: int, batch: int = 1, waiting: int = 0) -> float:
    """Episodes per second accepted (durable, fsynced) with no nodes to run them: by SubmitEpisode,
    or with `batch` > 1 by SubmitEpisodes calls of that many, into a state that holds `waiting`
    episodes already (a trainer's earlier batches). The orchestrator is `stasis server` in a
    process of its own, as deployed; the clients are in this one, as a trainer's are in its."""
    state_dir = root / f"submit-{batch}-{waiting}"
    state_dir.mkdir(parents=True)
    if waiting:
        store = SqliteStateStore(state_dir / "state.db")
        _fill(store, waiting, ControlSettings().address_pool)  # the pool the server hands out
        store.close()
    address = f"127.0.0.1:{free_port()}"
    with open(state_dir / "server.log", "wb") as log:
        server = subprocess.Popen(
            [STASIS, "server", "--listen", address, "--state-dir", str(state_dir), "--insecure"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # The bench's own plaintext orchestrator: none of the operator's contexts applies.
        context = Context("bench", address)
        with StasisClient(address, context=context, retry_for_s=60) as client:
            client.submit(SPEC)  # once the server is up; this warms the channel too

            def call(_: int) -> None:
                client.submit(SPEC) if batch == 1 else client.submit_many([SPEC] * batch)

            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(call, range(submits // batch)))
            return submits // batch * batch / (time.perf_counter() - started)
    finally:
        server.terminate()
        server.wait(30)


def preempt_resume(root: Path, cycles: int) -> list[tuple[float, float, float, float]]:
    """(preempt wall, checkpoint inside the agent, resume wall, restore inside the agent), in ms."""
    stack = LocalStack(LocalSettings(state_dir=root / "stack", nodes=2, slots=1, listen="127.0.0.1:0"))
    stack.start()
    rows = []
    try:
        with stack.client() as c:
            episode = c.submit(SPEC)
            c.wait(episode.id, ["RUNNING"], timeout_s=60)
            for i in range(cycles):
                time.sleep(0.5)
                started = time.perf_counter()
                c.preempt(episode.id)
                c.wait(episode.id, ["PREEMPTED"], timeout_s=60)
                preempt_ms = (time.perf_counter() - started) * 1000
                snap = c.snapshots(episode.id)[-1]
                inside_ckpt = snap.timings_ms["total_ms"]  # the agent's whole checkpoint call
                node = "node-2" if i % 2 == 0 else "node-1"
                started = time.perf_counter()
                c.resume(episode.id, node=node)
                c.wait(episode.id, ["RUNNING"], timeout_s=60)
                resume_ms = (time.perf_counter() - started) * 1000
                reason = c.get(episode.id).reason  # "restored on … (fetch_ms …, total_ms N, … ms)"
                inside_restore = float(re.search(r"\btotal_ms (\d+)", reason).group(1))  # type: ignore[union-attr]
                rows.append((preempt_ms, inside_ckpt, resume_ms, inside_restore))
            c.cancel(episode.id)
    finally:
        stack.stop()
        for node_root in sorted((stack.state_dir / "nodes").glob("*")):
            settings = AgentSettings(
                node=node_root.name, root=node_root, stack=stack.settings.stack, base_image_tar=None
            )
            node = Node(settings)
            node.delete_all()
            node.close()
    return rows


def tick_cost(root: Path, queued: list[int], repeats: int = 5) -> list[tuple[int, float, float, int]]:
    """(waiting episodes, ms a tick reads and plans as before: every live episode; ms as now: those
    on nodes, and the queue's head; decisions), medians of `repeats`, on the embedded store. Two
    nodes of four slots run eight episodes; the rest wait, as a trainer's batch does."""
    store = SqliteStateStore(root / "tick" / "state.db")
    pool = "10.128.0.0/9"
    nodes = [
        NodeRecord(name, "", NodeState.READY, "runc", 4, 8192, {"sha256:b": ["base"]}, {}, 0.0)
        for name in ("node-1", "node-2")
    ]
    for i, e in enumerate(store.episodes.submit_many([(EPISODE, "")] * 8, ids.address_pool(pool))):
        store.episodes.transition(
            e.id, EpisodeState.RUNNING, "started", node=nodes[i % 2].name, run_started_at=time.time()
        )
    rows = []
    try:
        for total in queued:
            _fill(store, total - len(store.episodes.query(states=[EpisodeState.PENDING])), pool)
            before, now_ms, decisions = [], [], 0
            for _ in range(repeats):
                started = time.perf_counter()
                scheduler.plan(
                    store.episodes.query(states=[s for s in EpisodeState if not s.terminal]),
                    nodes,
                    time.time(),
                )
                before.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                placed = store.episodes.on_nodes()
                decisions = len(
                    scheduler.plan(placed, nodes, time.time(), queue=store.episodes.queue(time.time()))
                )
                now_ms.append((time.perf_counter() - started) * 1000)
            rows.append((total, statistics.median(before), statistics.median(now_ms), decisions))
    finally:
        store.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--submits", type=int, default=600)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument("--queued", default="1000,10000,50000", help="queue lengths a tick is measured at")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stasis-cp-bench-", dir="/var/tmp"))
    try:
        rate = submit_throughput(root, a.submits, a.threads)
        print(
            f"submit: {a.submits} episodes over {a.threads} client threads: {rate:.0f} episodes/s (each fsynced)"
        )
        rows = preempt_resume(root, a.cycles)
        for name, wall, inside in (("preempt", 0, 1), ("resume", 2, 3)):
            w = statistics.median(r[wall] for r in rows)
            i = statistics.median(r[inside] for r in rows)
            print(
                f"{name}: wall {w:.0f} ms, runtime inside the agent {i:.0f} ms, control-plane overhead "
                f"{w - i:.0f} ms ({w / i:.2f}x the runtime's own time), median of {len(rows)}"
            )
        for waiting, before, now_ms, decisions in tick_cost(root, [int(n) for n in a.queued.split(",")]):
            print(
                f"tick with {waiting} waiting on 2 full nodes: {now_ms:.1f} ms read and planned, against "
                f"{before:.1f} ms reading every live episode ({before / now_ms:.0f}x), {decisions} decisions"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
