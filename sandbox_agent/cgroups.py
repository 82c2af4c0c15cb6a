"""How the node's kernel moves tasks between cgroups.

Moving a task into a cgroup (what runc does to CRIU on every restore, and to a new sandbox's init)
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
from pathlib import Path

from sandbox_agent import _command

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
    result = _command.run(
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
