"""Freezing and thawing a sandbox's cgroup through the cgroup filesystem.

This is what `runc pause` and `runc resume` do, without starting runc (5-7 ms each, all of it
inside the freeze). A sandbox frozen here is paused (`frozen`), as runc would read it back.
Both cgroup versions: v1's freezer controller (`freezer.state`) and v2's `cgroup.freeze`, whose
`cgroup.events` says when every task has stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

from sandbox_agent.errors import FailedPrecondition

CGROUP_ROOT = Path("/sys/fs/cgroup")

FREEZE_TIMEOUT_S = 10.0
"""How long a freeze may take before it is given up (and the cgroup thawed): tasks in an
uninterruptible sleep (a slow disk, a stuck FUSE server) delay it."""


def freeze(cgroup: str, root: Path = CGROUP_ROOT, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
    """Freeze every task of `cgroup` (a path below the hierarchy's root, as in the OCI spec's
    cgroupsPath) and return once all of them are stopped. If they do not all stop within
    `timeout_s`, thaw the cgroup and raise FailedPrecondition."""
    v1 = _v1(cgroup, root)
    deadline = time.monotonic() + timeout_s
    pause = 0.0002
    while True:
        if v1 is not None:
            # A write may leave the cgroup FREEZING while a task is busy in the kernel; writing
            # again retries the tasks still running.
            v1.write_text("FROZEN")
            frozen = v1.read_text().strip() == "FROZEN"
        else:
            (root / cgroup.lstrip("/") / "cgroup.freeze").write_text("1")
            frozen = "frozen 1" in _v2_events(cgroup, root)
        if frozen:
            return
        if time.monotonic() > deadline:
            thaw(cgroup, root)
            raise FailedPrecondition(f"cgroup {cgroup} did not freeze within {timeout_s:g} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def thaw(cgroup: str, root: Path = CGROUP_ROOT) -> None:
    """Let the tasks of `cgroup` run again."""
    v1 = _v1(cgroup, root)
    if v1 is not None:
        v1.write_text("THAWED")
    else:
        (root / cgroup.lstrip("/") / "cgroup.freeze").write_text("0")


def frozen(cgroup: str, root: Path = CGROUP_ROOT) -> bool:
    """Whether `cgroup` is frozen (what runc calls paused); False if it is gone."""
    try:
        v1 = _v1(cgroup, root)
        if v1 is not None:
            return v1.read_text().strip() == "FROZEN"
        return (root / cgroup.lstrip("/") / "cgroup.freeze").read_text().strip() == "1"
    except (OSError, FailedPrecondition):
        return False


def _v1(cgroup: str, root: Path) -> Path | None:
    """The cgroup's v1 `freezer.state`, or None on a v2 (unified) hierarchy."""
    state = root / "freezer" / cgroup.lstrip("/") / "freezer.state"
    if state.exists():
        return state
    if (root / "cgroup.controllers").exists():
        return None
    raise FailedPrecondition(f"cgroup {cgroup} has no freezer under {root}")


def _v2_events(cgroup: str, root: Path) -> str:
    return (root / cgroup.lstrip("/") / "cgroup.events").read_text()
