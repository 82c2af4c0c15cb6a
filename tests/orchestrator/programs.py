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


def fork_counter(steps: int, step_s: float = 0.25, memory_mb: int = 8) -> str:
    """`counter`, where each line of /work/steps.log also says who wrote it: `root`, or after a
    fork the child's index, read from /.stasis/fork.json as a harness watching it would. At the
    end it checks the memory, the count, and that from the child's first line on every line is
    its own: what it inherited is the parent's, what it wrote after is its alone."""
    return f"""\
import hashlib, json, os, random, time
buf = bytearray(random.Random(5).randbytes({memory_mb} << 20))
want = hashlib.sha256(buf).hexdigest()
os.makedirs("/work", exist_ok=True)
steps, me = 0, "root"
while steps < {steps}:
    steps += 1
    try:
        me = str(json.load(open("/.stasis/fork.json"))["index"])
    except OSError:
        pass
    with open("/work/steps.log", "a") as f:
        f.write(f"{{steps}} {{me}}\\n")
    print("step", steps, "as", me, flush=True)
    time.sleep({step_s})
lines = [line.split() for line in open("/work/steps.log").read().splitlines()]
marks = [m for _, m in lines]
ok = [int(n) for n, _ in lines] == list(range(1, steps + 1)) and hashlib.sha256(buf).hexdigest() == want
ok = ok and (me == "root" or set(marks[marks.index(me):]) == {{me}})
print("memory and files intact:", ok, "as", me, flush=True)
raise SystemExit(0 if ok else 3)
"""
