"""How the node's kernel moves tasks between cgroups.

Moving a task into a cgroup (what a restore does to CRIU, and runc to a new sandbox's init)
takes a lock that every fork and exit on the host also takes. By default the kernel keeps that
lock cheap for forks and makes a move wait for an RCU grace period first: 7-16 ms on the VMs
measured, in the middle of every restore. The cgroup2 mount option `favordynmods` turns that
around: a move takes microseconds, and forks and exits take a real read lock instead of a
per-CPU counter ("hot path operations such as forks and exits more expensive", in the kernel's
words). A node that restores sandboxes all day wants the second. It is host-wide, and on
Linux 6.18 it lasts until reboot: a remount without the option clears the flag, and moves stay
fast. The lock is one for the whole host, so setting the
option on any cgroup2 mount is enough, also on a cgroup v1 host with a unified hierarchy beside.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandbox_agent.host import tools
from sandbox_agent.host.freezer import CGROUP_ROOT as ROOT

log = logging.getLogger(__name__)

OPTION = "favordynmods"


def _cgroup2_mounts(mountinfo: Path) -> list[tuple[Path, list[str]]]:
    """Each cgroup2 mount point with its superblock's options, as mountinfo gives them."""
    found = []
    for line in mountinfo.read_text().splitlines():
        # "<id> <parent> <dev> <root> <mount point> <options> [optional...] - <type> <source> <super options>"
        fields, _, tail = line.partition(" - ")
        tail_fields = tail.split(" ")
        if len(tail_fields) == 3 and tail_fields[0] == "cgroup2":
            point = fields.split(" ")[4].replace("\\040", " ")
            found.append((Path(point), tail_fields[2].split(",")))
    return found


def favor_moves(mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Make moves between cgroups fast on this host (see the module's docstring), once; True if
    they are. A host without a cgroup2 mount, or whose kernel lacks the option, stays as it was."""
    mounts = _cgroup2_mounts(mountinfo)
    if any(OPTION in options for _, options in mounts):
        return True
    if not mounts:
        log.warning("no cgroup2 mount on this host: each restore waits for the kernel to move CRIU")
        return False
    point, options = mounts[0]
    # A remount sets every flag of the superblock anew: the ones it has are named again.
    kept = [o for o in options if o not in ("rw", "ro")]
    result = tools.run(
        ["mount", "-o", ",".join(["remount", *kept, OPTION]), str(point)],
        check=False,
        what=f"remounting {point} with {OPTION}",
    )
    # Outside the host's cgroup namespace a remount succeeds and changes nothing.
    if result.returncode != 0 or not any(OPTION in o for p, o in _cgroup2_mounts(mountinfo) if p == point):
        log.warning(
            "could not remount %s with %s (%s): each restore waits for the kernel to move CRIU",
            point, OPTION, result.stderr_tail or "the option did not take",
        )  # fmt: skip
        return False
    log.info("remounted %s with %s: tasks move between cgroups without waiting", point, OPTION)
    return True


# What runc makes of a sandbox's cgroups, for a restore that CRIU does without runc: a cgroup in
# every hierarchy, with runc's own values for the spec's resources (`RuncBackend.oci_spec`).

DEVICE_RULES = (
    "b *:* m", "c *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
    "c 5:0 rwm", "c 5:2 rwm", "c 10:200 rwm", "c 136:* rwm",
)  # fmt: skip
"""runc's device rules for a container that names no devices (its spec's "deny all" then its
defaults), in the order runc writes them, which `devices.list` keeps: any node may be made,
which the missing CAP_MKNOD refuses anyway, and only null, zero, full, random, urandom, tty,
ptmx, tun and the ptys may be opened."""


def v1(root: Path = ROOT) -> bool:
    """True on a host whose controllers are cgroup v1 hierarchies (a unified one may sit beside
    them). On a v2-only host the device rules are an eBPF program only runc attaches."""
    return (root / "devices").is_dir() and not (root / "cgroup.controllers").exists()


def hierarchies(root: Path = ROOT) -> list[Path]:
    """Every mounted hierarchy (one per v1 controller, runc's name=systemd one, the unified one)."""
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink())


def make(path: str, resources: Mapping[str, Any], root: Path = ROOT) -> None:
    """Make the cgroup `path` (as in the OCI spec's cgroupsPath) in every v1 hierarchy with the
    limits runc sets for the spec's `linux.resources` (memory, CPU and pids); what exists
    already is set again."""
    inner = path.strip("/")
    for hierarchy in hierarchies(root):
        if hierarchy.name == "cpuset":
            _make_cpuset(hierarchy, inner)
        else:
            (hierarchy / inner).mkdir(parents=True, exist_ok=True)
    limits = (
        ("memory", "memory.limit_in_bytes", resources["memory"]["limit"]),
        ("cpu", "cpu.cfs_period_us", resources["cpu"]["period"]),
        ("cpu", "cpu.cfs_quota_us", resources["cpu"]["quota"]),
        ("pids", "pids.max", resources["pids"]["limit"]),
        ("devices", "devices.deny", "a"),
        *(("devices", "devices.allow", rule) for rule in DEVICE_RULES),
    )
    for controller, name, value in limits:
        (root / controller / inner / name).write_text(str(value))


def _make_cpuset(hierarchy: Path, inner: str) -> None:
    """A cpuset cgroup takes no task until it has cpus and mems: each new level gets its parent's."""
    parent = hierarchy
    for part in inner.split("/"):
        folder = parent / part
        if not folder.is_dir():
            folder.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not (folder / name).read_text().strip():
                (folder / name).write_text((parent / name).read_text().strip())
        parent = folder


def enter(path: str, pid: int, root: Path = ROOT) -> None:
    """Move process `pid` into the cgroup `path` of every hierarchy."""
    inner = path.strip("/")
    for hierarchy in hierarchies(root):
        (hierarchy / inner / "cgroup.procs").write_text(str(pid))


def procs(path: str, root: Path = ROOT) -> set[int]:
    """The pids in the cgroup `path`, in any hierarchy; none once it is gone."""
    inner = path.strip("/")
    found: set[int] = set()
    for hierarchy in hierarchies(root):
        try:
            found.update(int(p) for p in (hierarchy / inner / "cgroup.procs").read_text().split())
        except OSError:  # absent in this hierarchy, or gone meanwhile
            continue
    return found
