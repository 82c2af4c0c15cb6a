"""Checkpoint and restore cost of a Stasis sandbox beside raw `criu dump`/`criu restore` of the same program.

    .venv/bin/python benchmarks/runtime_checkpoint.py [--sizes 64,1024]

For each size the same Python program holds a seeded random buffer of that many MiB. Raw CRIU
dumps and restores it as a plain host process; Stasis checkpoints it in a runc sandbox on one
node and restores it on another (freeze, dump, layer, hashing; then verify, layer, CRIU restore).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox_agent import AgentSettings, Node, Resources, SandboxSpec

PROGRAM = """
import random, sys, time
size, step, rng = int(sys.argv[1]) << 20, 16 << 20, random.Random(7)
buf = bytearray(size)
for off in range(0, size, step):
    buf[off:off + step] = rng.randbytes(min(step, size - off))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _wait_for(path: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{path} never showed {text!r}")


def raw_criu(size_mb: int, work: Path) -> tuple[float, float]:
    work.mkdir()
    out = work / "out.log"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            ["python3", "-c", PROGRAM, str(size_mb)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    _wait_for(out, "ready")
    images = work / "images"
    images.mkdir()
    started = time.monotonic()
    subprocess.run(["criu", "dump", "-t", str(proc.pid), "-D", str(images), "-o", "dump.log"], check=True)
    dump_ms = (time.monotonic() - started) * 1000
    proc.wait()
    started = time.monotonic()
    subprocess.run(["criu", "restore", "-d", "-D", str(images), "-o", "restore.log"], check=True)
    restore_ms = (time.monotonic() - started) * 1000
    os.kill(proc.pid, signal.SIGKILL)
    return dump_ms, restore_ms


def stasis(size_mb: int, a: Node, b: Node, work: Path) -> dict[str, float]:
    sid = f"bench-{size_mb}"
    spec = SandboxSpec(
        image="base",
        command=("python3", "-c", PROGRAM, str(size_mb)),
        address="10.254.0.2",
        resources=Resources(memory_mb=size_mb + 512),
    )
    a.create(sid, spec)
    deadline = time.monotonic() + 120
    while b"ready" not in a.harness_log(sid):
        if time.monotonic() > deadline:
            raise TimeoutError("sandbox never got ready")
        time.sleep(0.05)
    started = time.monotonic()
    c = a.checkpoint(sid, work / "ck", leave_running=False)
    checkpoint_ms = (time.monotonic() - started) * 1000
    restored = b.restore(sid, work / "ck")
    b.delete(sid)
    return {
        "checkpoint_ms": checkpoint_ms,
        "frozen_ms": c.timings_ms["frozen_ms"],
        "dump_ms": c.timings_ms["dump_ms"],
        "layer_ms": c.timings_ms["layer_ms"],
        "restore_ms": restored.record.timings_ms["total_ms"],
        "verify_ms": restored.record.timings_ms["verify_ms"],
        "criu_restore_ms": restored.record.timings_ms["restore_ms"],
        "criu_mb": c.sizes.criu_bytes / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,1024")
    sizes = [int(s) for s in p.parse_args().sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="stasis-bench-", dir="/var/tmp"))
    a = Node(AgentSettings(node="bench-a", root=root / "a"))
    b = Node(AgentSettings(node="bench-b", root=root / "b"))
    try:
        print(
            f"{'size':>6} | {'raw dump':>9} {'stasis ckpt':>11} {'ratio':>5} | {'raw restore':>11} {'stasis restore':>14} {'ratio':>5} | breakdown"
        )
        for size in sizes:
            raw_dump, raw_restore = raw_criu(size, root / f"raw-{size}")
            s = stasis(size, a, b, root / f"stasis-{size}")
            print(
                f"{size:>4}Mi | {raw_dump:>7.0f}ms {s['checkpoint_ms']:>9.0f}ms {s['checkpoint_ms'] / raw_dump:>5.2f} | "
                f"{raw_restore:>9.0f}ms {s['restore_ms']:>12.0f}ms {s['restore_ms'] / raw_restore:>5.2f} | "
                f"frozen {s['frozen_ms']:.0f} dump {s['dump_ms']:.0f} layer {s['layer_ms']:.0f} ms; "
                f"restore: verify {s['verify_ms']:.0f} layer+criu {s['criu_restore_ms']:.0f} ms; images {s['criu_mb']:.0f} MiB"
            )
    finally:
        a.delete_all()
        b.delete_all()
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
