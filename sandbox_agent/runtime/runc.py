"""The default backend: runc runs a sandbox over an overlay root (`rootfs`, `bundle`); its
checkpoints are CRIU's, asked straight (`runc_criu`).

From the start on, the sandbox is known by its init's pid file and its cgroups, not by runc's
state: a restored sandbox has none.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal as signals
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sandbox_agent.criu.core import Criu
from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.host import cgroups, freezer, overlay, tools
from sandbox_agent.images.cache import Image
from sandbox_agent.runtime import bundle
from sandbox_agent.runtime.backend import SandboxLayout
from sandbox_agent.runtime.bundle import CGROUP_PARENT
from sandbox_agent.runtime.rootfs import RootFs
from sandbox_agent.runtime.runc_criu import RuncCheckpoints
from sandbox_agent.spec import SandboxRecord, SandboxState

log = logging.getLogger(__name__)

_PF_EXITING = 0x4
"""<linux/sched.h>: set in a task's flags (the 9th field of /proc/<pid>/stat) once it exits."""


def ended(stat: str) -> bool:
    """Whether the task that a /proc/<pid>/stat line describes has ended: dead, a zombie, or
    exiting. Exiting counts: a killed task leaves its cgroup's `cgroup.procs` before it is a
    zombie, and a SIGKILL that waited for an empty cgroup may look in between."""
    fields = stat.rpartition(")")[2].split()  # from the state on: state, ppid, ..., flags
    return fields[0] in "ZX" or bool(int(fields[6]) & _PF_EXITING)


class RuncBackend:
    name = "runc"
    wants_netns = True
    """The node makes the sandbox's network namespace; runc joins it by path."""
    user_namespaces = True
    """Sandboxes may run in a user namespace of their own (`AgentSettings.userns_base`)."""
    runs_verifiers = True
    """A verifier may see an exited sandbox's final tree (`mount_graded`)."""

    def __init__(self, node: str, state_root: Path, criu: Criu, rootfs: RootFs) -> None:
        self.node = node
        """The node's `AgentSettings.host_key`: it names the sandboxes' cgroups and netns."""
        self.state_root = state_root
        """runc's own state dir; one per node keeps two agents on one host apart."""
        self.criu = criu
        self.rootfs = rootfs
        self.checkpoints = RuncCheckpoints(self, criu, rootfs)
        state_root.mkdir(parents=True, exist_ok=True)
        self._cgroups_lock = threading.Lock()
        self._cgroups_in_making = 0

    def runc(self, *args: str, check: bool = True, what: str = "", timeout: float = 600) -> tools.Completed:
        return tools.run(
            ["runc", "--root", str(self.state_root), "--criu", self.criu.binary, *args],
            check=check,
            stdin=tools.DEVNULL,
            what=what or f"runc {args[0]}",
            timeout=timeout,
        )

    def cgroups_path(self, sandbox_id: str) -> str:
        return bundle.cgroups_path(self.node, sandbox_id)

    @contextmanager
    def making_cgroups(self) -> Iterator[None]:
        """Around whatever makes a sandbox's cgroups (`runc run`, `runc restore`, `cgroups.make`):
        meanwhile the node's own cgroup stays, even if its last other sandbox goes. Made anew
        under a parent being removed, runc fails reading the parent's cpuset.cpus (ENODEV)."""
        with self._cgroups_lock:
            self._cgroups_in_making += 1
        try:
            yield
        finally:
            with self._cgroups_lock:
                self._cgroups_in_making -= 1

    @staticmethod
    def pid_file(layout: SandboxLayout) -> Path:
        """The sandbox's init's pid, written by `runc run` or by a restore."""
        return layout.dir / "init.pid"

    def oci_spec(self, record: SandboxRecord, layout: SandboxLayout) -> dict[str, Any]:
        ids = self.rootfs.idmap(record.spec.userns_base)
        return bundle.oci_spec(record, layout, self.node, ids, self.criu.config_file or Path())

    def write_bundle(
        self, record: SandboxRecord, layout: SandboxLayout, graded: Path | None = None
    ) -> dict[str, Any]:
        return bundle.write(layout, self.oci_spec(record, layout), graded)

    def create(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        files: dict[str, bytes],
        graded: Path | None = None,
    ) -> None:
        self.rootfs.build(record, layout, image, files)
        ids = self.rootfs.idmap(record.spec.userns_base)
        bundle.write(
            layout, bundle.oci_spec(record, layout, self.node, ids, self.criu.config_file or Path()), graded
        )

    def mount_graded(self, layout: SandboxLayout, image: Image, userns_base: int) -> Path:
        return self.rootfs.mount_graded(layout, image, userns_base)

    def start(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        with self.making_cgroups():
            self.runc(
                "run", "--detach", "--bundle", str(layout.bundle), "--pid-file", str(self.pid_file(layout)),
                record.id, what=f"starting sandbox {record.id}",
            )  # fmt: skip

    def upper_dir(self, record: SandboxRecord, layout: SandboxLayout) -> Path:
        return layout.upper

    def freeze(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        freezer.freeze(self.cgroups_path(record.id))

    def thaw(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        freezer.thaw(self.cgroups_path(record.id))

    def warm(self, userns_base: int) -> None:
        self.rootfs.warm(userns_base)

    def close(self) -> None:
        self.rootfs.close()

    def forget(self, sandbox_id: str) -> None:
        """Remove runc's state of a sandbox it started, if it has any (a restored one has none)."""
        if (self.state_root / sandbox_id).exists():
            self.runc("delete", "--force", sandbox_id, check=False)

    def status(self, record: SandboxRecord, layout: SandboxLayout) -> tuple[SandboxState, int]:
        """RUNNING or PAUSED (its cgroup frozen) while the init in the pid file lives in the
        sandbox's cgroup; EXITED once it has `ended` or its pid went to another process."""
        try:
            pid = int(self.pid_file(layout).read_text())
            stat = Path(f"/proc/{pid}/stat").read_text()
            own = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except (OSError, ValueError):
            return SandboxState.EXITED, 0
        cgroup = self.cgroups_path(record.id)
        if ended(stat) or not any(line.endswith(f":{cgroup}") for line in own):
            return SandboxState.EXITED, 0
        return (SandboxState.PAUSED if freezer.frozen(cgroup) else SandboxState.RUNNING), pid

    def kill(self, record: SandboxRecord, layout: SandboxLayout, signal: int) -> None:
        """Signal every task of the sandbox, frozen meanwhile so that none forks past it (what
        `runc kill --all` does); the sandbox is thawed after, so that they act on it. SIGKILL
        returns once they are gone."""
        if signal == signals.SIGKILL:
            self.kill_tasks(record.id)
            return
        cgroup = self.cgroups_path(record.id)
        with suppress(OSError, FailedPrecondition):
            freezer.freeze(cgroup)
        try:
            for pid in cgroups.procs(cgroup):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal)
        finally:
            with suppress(OSError, FailedPrecondition):
                freezer.thaw(cgroup)

    def destroy(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        if not self.checkpoints.direct:  # on a v2-only host runc's device rules go with its delete
            self.forget(record.id)
        # What is left when runc or CRIU hung and was killed: the tasks in the sandbox's cgroups
        # (a restoring CRIU among them: it is placed there first), and runc's state of the
        # container with its mount of the root for CRIU. Once the tasks are gone, that state is
        # files and a mount, removed here as `runc delete` would (its process took 5 ms).
        self.kill_tasks(record.id)
        overlay.unmount_below(self.state_root / record.id, layout.reachable, layout.mapped)
        shutil.rmtree(self.state_root / record.id, ignore_errors=True)
        self._remove_cgroups(record.id)

    def kill_tasks(self, sandbox_id: str, timeout_s: float = 10.0) -> None:
        """SIGKILL every task in the sandbox's cgroups and wait until they are gone."""
        cgroup = self.cgroups_path(sandbox_id)
        deadline = time.monotonic() + timeout_s
        pause = 0.0005  # the tasks of a stopping dump are already dying: look again soon
        while pids := cgroups.procs(cgroup):
            if time.monotonic() > deadline:
                log.warning("tasks %s of sandbox %s outlived SIGKILL", sorted(pids), sandbox_id)
                return
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
            with suppress(OSError, FailedPrecondition):
                freezer.thaw(cgroup)  # frozen tasks die thawed
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _remove_cgroups(self, sandbox_id: str) -> None:
        """The sandbox's cgroups, then the node's if that was its last and none is being made
        (`making_cgroups`). The `stasis` parent stays: every node of every stack on the host makes
        its cgroups under it, from other processes."""
        with self._cgroups_lock:
            for hierarchy in cgroups.hierarchies():
                node_dir = hierarchy / CGROUP_PARENT / self.node
                for d in (node_dir / sandbox_id, node_dir)[: 1 if self._cgroups_in_making else 2]:
                    try:
                        d.rmdir()
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    except OSError:
                        break  # still in use by another sandbox

    def remove_leftovers(self, keep: set[str]) -> list[str]:
        """Sandboxes runc has a state of, or that have cgroups of this node (a restored one):
        their tasks, runc's state and mounts, and their cgroups. Only this node's: its cgroups
        are named by its `host_key`, which another stack's node of the same name does not share.
        Their netns and veths are the node's to reclaim (`network.reclaim`)."""
        found = (
            {d.name for d in self.state_root.iterdir() if d.is_dir()} if self.state_root.is_dir() else set()
        )
        for hierarchy in cgroups.hierarchies():
            node_dir = hierarchy / CGROUP_PARENT / self.node
            if node_dir.is_dir():
                found.update(d.name for d in node_dir.iterdir() if d.is_dir())
        removed = sorted(found - keep)
        for sandbox_id in removed:
            self.forget(sandbox_id)
            self.kill_tasks(sandbox_id)
            overlay.unmount_below(self.state_root / sandbox_id)
            shutil.rmtree(self.state_root / sandbox_id, ignore_errors=True)
            self._remove_cgroups(sandbox_id)
        return removed
