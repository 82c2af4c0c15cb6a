"""Episode programs for orchestrator tests; each exits 0 only if its memory and files agree."""

from __future__ import annotations

from typing import Any


def counter(steps: int, step_s: float = 0.25, memory_mb: int = 8) -> str:
    """Counts steps into memory and /work/steps.log; at the end checks both still agree."""
    return f"""\
import hashlib, os, random, time
buf = bytearray(random.Random(5).randbytes({memory_mb} << 20))
want = hashlib.sha256(buf).hexdigest()
os.makedirs("/work", exist_ok=True)
steps = 0
while steps < {steps}:
    steps += 1
    with open("/work/steps.log", "a") as f:
        f.write(f"{{steps}}\\n")
    print("step", steps, flush=True)
    time.sleep({step_s})
lines = open("/work/steps.log").read().split()
ok = lines == [str(i) for i in range(1, steps + 1)] and hashlib.sha256(buf).hexdigest() == want
print("memory and files intact:", ok, flush=True)
raise SystemExit(0 if ok else 3)
"""


def counter_spec(steps: int, **preemption: Any) -> dict[str, Any]:
    return {
        "image": "base",
        "command": ["python3", "-c", counter(steps)],
        "resources": {"cpus": 0.5, "memory_mb": 256},
        "preemption": preemption,
    }
