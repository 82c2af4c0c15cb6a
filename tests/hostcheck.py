"""What a Stasis test could leave on the host, and how to look for it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f]


def leftovers() -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/stasis/*") if p.is_dir()]
    return {
        "mounts": [m for m in _mounts() if "stasis" in m or "/sandboxes/" in m],
        "netns": [line.split()[0] for line in netns if line.startswith("stasis-")],
        "veths": [n for n in os.listdir("/sys/class/net") if n.startswith(("stx", "stp"))],
        "cgroups": cgroups,
    }


def unmount_below(root: Path) -> None:
    for m in sorted(_mounts(), reverse=True):
        if m.startswith(str(root)):
            subprocess.run(["umount", "-l", m], capture_output=True)
