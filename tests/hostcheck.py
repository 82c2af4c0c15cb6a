"""What a Stasis test could leave on the host, and how to look for it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from sandbox_agent.host import network
from tests import faults


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f]


VETH_GRACE_S = 2.0
"""A destroyed sandbox's veth goes with its netns, in the kernel's background, 25-60 ms after
`network.destroy`: such veths get this long to go before they count as left behind."""


def _veths() -> list[str]:
    return [n for n in os.listdir("/sys/class/net") if n.startswith(network.VETH_PREFIX)]


def leftovers() -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/stasis/*") if p.is_dir()]
    deadline = time.monotonic() + VETH_GRACE_S
    veths = _veths()
    while any(network._departed(v) for v in veths) and time.monotonic() < deadline:
        time.sleep(0.02)
        veths = _veths()
    return {
        "mounts": [m for m in _mounts() if "stasis" in m or "/sandboxes/" in m],
        "netns": [line.split()[0] for line in netns if line.startswith(network.NETNS_PREFIX)],
        "veths": veths,
        "cgroups": cgroups,
        "fault rules": faults.leftover_rules(),
    }


def sandbox_leftovers() -> dict[str, list[str]]:
    """What any one test must not leave: sandbox netns, veths, mounts and fault rules (a stale /32 route goes
    with its veth, and would refuse every later sandbox that is given the same address)."""
    found = leftovers()
    found["mounts"] = [
        m for m in found["mounts"] if "/sandboxes/" in m or m.startswith(("/run/stasis/", "/run/netns/"))
    ]
    del found["cgroups"]  # a cgroup goes once its last process is reaped, a moment after the test
    return found


def remove(leaked: dict[str, list[str]]) -> None:
    """Take away what a test leaked, so the tests after it start from a clean host."""
    for m in sorted(leaked.get("mounts", []), reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    for ns in leaked.get("netns", []):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in leaked.get("veths", []):
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for rule in leaked.get("fault rules", []):  # as `iptables -S` spells it: "-A OUTPUT ..."
        subprocess.run(["iptables", "-w", "-D", *rule.split()[1:]], capture_output=True)


def forget_allowances(before: list[tuple[str, ...]]) -> None:
    """Drop the gateway allowances that nodes added since `before`. A node's allowance outlives
    its agent by design (its sandboxes may still run), so a test's ends with the test: a later
    test's server could otherwise get the same port and be reachable from its sandboxes."""
    for rule in network.allowances():
        if rule not in before:
            subprocess.run(["iptables", "-w", "-D", network.ISOLATION_CHAIN, *rule], capture_output=True)


def unmount_below(root: Path) -> None:
    for m in sorted(_mounts(), reverse=True):
        if m.startswith(str(root)):
            subprocess.run(["umount", "-l", m], capture_output=True)
