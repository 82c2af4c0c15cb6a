"""Move a running sandbox between two local nodes and print what it cost.

sudo .venv/bin/python examples/runtime_demo.py
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from sandbox_agent import AgentSettings, Node, SandboxSpec

PROGRAM = (
    "import time\ni = 0\nwhile True:\n    i += 1\n    print('step', i, flush=True)\n    time.sleep(0.5)\n"
)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="stasis-demo-"))
    a = Node(AgentSettings(node="demo-a", root=root / "a"))
    b = Node(AgentSettings(node="demo-b", root=root / "b"))
    try:
        a.create("demo", SandboxSpec(image="base", command=("python3", "-c", PROGRAM), address="10.250.0.2"))
        time.sleep(2)
        print("on demo-a:", a.harness_log("demo").decode().split()[-2:])
        c = a.checkpoint("demo", root / "checkpoint", leave_running=False)
        print(
            f"checkpoint: frozen {c.timings.frozen_ms} ms, dump {c.timings.dump_ms} ms, layer {c.timings.layer_ms} ms"
        )
        print(f"            {c.sizes.criu_bytes} CRIU image bytes, {c.sizes.layer_bytes} layer bytes")
        started = time.monotonic()
        b.restore("demo", root / "checkpoint")
        print(f"restored on demo-b in {(time.monotonic() - started) * 1000:.0f} ms")
        time.sleep(2)
        print("on demo-b:", b.harness_log("demo").decode().split()[-2:])
    finally:
        a.delete_all()
        b.delete_all()
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
