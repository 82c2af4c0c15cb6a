"""Checkpoints of runc sandboxes: CRIU asked straight (`criu.core`), where `runc checkpoint` and
`runc restore` spent 12-25 ms of their own on each (runc's start, its question for CRIU's
version, its state).

A restore makes the sandbox's cgroups itself while the snapshot's files arrive, and CRIU joins
them before it forks the sandbox's tasks. On a cgroup v2-only host, whose device rules are an
eBPF program only runc attaches, runc drives CRIU as before. From the start on, the sandbox is
known by its init's pid file and its cgroups, not by runc's state: a restored sandbox has none.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox_agent.checkpoint import CheckpointImage
from sandbox_agent.criu import lazy, stats
from sandbox_agent.criu.core import Criu, DumpOptions, RestoreOptions, failure_logged
from sandbox_agent.errors import CommandFailed, FailedPrecondition
from sandbox_agent.host import cgroups, network, overlay
from sandbox_agent.images.cache import Image
from sandbox_agent.runtime import bundle
from sandbox_agent.runtime.backend import LayerFile, SandboxLayout
from sandbox_agent.runtime.rootfs import RootFs
from sandbox_agent.spec import SandboxRecord, SandboxState

if TYPE_CHECKING:
    from sandbox_agent.runtime.runc import RuncBackend


class RuncCheckpoints:
    """Dumps and restores of the sandboxes a `RuncBackend` runs."""

    lazy_restore = True
    """Restores may take their memory lazily (`lazy.Transfer`)."""
    places_files = True
    """A restore writes a fork child's files into its layer (`rootfs.place`)."""

    def __init__(self, runc: RuncBackend, criu: Criu, rootfs: RootFs) -> None:
        self.runc = runc
        self.criu = criu
        self.rootfs = rootfs
        self.restore_timeout_s = 300.0
        """How long a restore may take before CRIU is killed and the restore fails (a CRIU that
        hangs, on a hung store read or in the kernel, must not hold the sandbox's slot)."""
        self.direct = cgroups.v1()
        """CRIU is driven here, not through runc (see the module's docstring)."""

    def dump(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        # On a paused container CRIU leaves the freezer as it found it: still frozen.
        self._dump(record, layout, images_dir, leave_running=True)

    def dump_and_stop(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> float | None:
        # CRIU freezes the sandbox's cgroup itself, once it has started, so the freeze is its
        # alone (our CRIU looks at the freezer again after 200 us, not 100 ms:
        # scripts/criu-patches/freeze-poll.patch). It kills the tasks once their images are
        # written. If the dump fails, CRIU thaws the tasks; the thaw here only makes sure.
        try:
            work = self._dump(record, layout, images_dir, leave_running=False)
        except BaseException:
            with suppress(OSError, FailedPrecondition):
                self.runc.thaw(record, layout)
            raise
        return stats.frozen_ms(work)

    def _dump(
        self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path, *, leave_running: bool
    ) -> Path:
        """Dump with CRIU (`runc checkpoint` on a v2-only host); return CRIU's work directory,
        where its log and its stats of this dump are. Without leave_running, this returns once
        the tasks are gone."""
        work = layout.criu_work / "dump"
        work.mkdir(parents=True, exist_ok=True)
        (work / stats.STATS_DUMP).unlink(missing_ok=True)  # an earlier dump's
        if not self.direct:
            with failure_logged(f"CRIU dump of sandbox {record.id}", work / "dump.log"):
                self.runc.runc(
                    "checkpoint", *(["--leave-running"] if leave_running else []), "--tcp-established",
                    "--file-locks", "--image-path", str(images_dir), "--work-path", str(work), record.id,
                )  # fmt: skip
            return work
        state, pid = self.runc.status(record, layout)
        if state == SandboxState.EXITED:
            raise FailedPrecondition(f"sandbox {record.id} has no running processes to dump")
        freezer = cgroups.ROOT / "freezer" / self.runc.cgroups_path(record.id).lstrip("/")
        self.criu.dump(
            DumpOptions(
                sandbox_id=record.id, pid=pid, images_dir=images_dir, work_dir=work,
                root=layout.rootfs, mounts=bundle.external_mounts(layout),
                netns=network.netns_path(self.runc.node, record.id), freeze_cgroup=freezer,
                leave_running=leave_running,
            )
        )  # fmt: skip
        if not leave_running:
            self.runc.kill_tasks(record.id)
        return work

    def prepare_restore(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        self.rootfs.layer_disk(record, layout)
        spec = self.runc.write_bundle(record, layout)
        if self.direct:
            with self.runc.making_cgroups():
                cgroups.make(spec["linux"]["cgroupsPath"], spec["linux"]["resources"])

    def restore(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        checkpoint: CheckpointImage,
        transfer: lazy.Transfer | None = None,
        files: tuple[LayerFile, ...] = (),
    ) -> int:
        try:
            if transfer is not None:
                # CRIU's lazy-pages daemon takes some milliseconds to start: the layer and the
                # root are made meanwhile.
                transfer.start(self.criu, checkpoint.criu_dir, _restore_work(layout))
            overlay.import_layer(checkpoint.layer, layout.upper)
            if files:
                self.rootfs.place(record, layout, image, files)
            self.rootfs.mount(record, layout, image)
            return self._restore(record, layout, checkpoint.criu_dir, transfer)
        except BaseException:
            if transfer is not None:  # however the restore failed, its daemon and server stop
                transfer.abort()
            raise

    def revive(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        # The rootfs stays mounted; only runc's record of the dead container must go, if a
        # checkpoint did not delete it already.
        self.runc.forget(record.id)
        if self.direct:
            spec = bundle.read(layout)
            with self.runc.making_cgroups():
                cgroups.make(spec["linux"]["cgroupsPath"], spec["linux"]["resources"])
        self._restore(record, layout, images_dir)

    def _restore(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        images_dir: Path,
        transfer: lazy.Transfer | None = None,
    ) -> int:
        """CRIU-restore the sandbox's processes and return its init's pid; with a `transfer`,
        lazily: they run at once and their memory arrives as they touch it (`transfer`, started)."""
        work = _restore_work(layout)
        pid_file = self.runc.pid_file(layout)
        pid_file.unlink(missing_ok=True)
        if record.spec.userns_base:
            # The restored tasks read their own images, as their unprivileged host ids: let them
            # pass through the directory CRIU holds open and read what is in it, nothing more.
            images_dir.chmod(0o711)
            for image in images_dir.iterdir():
                image.chmod(0o644)
        if transfer is not None:
            transfer.ready()
        try:
            if self.direct:
                pid = self.criu.restore(
                    RestoreOptions(
                        sandbox_id=record.id, images_dir=images_dir, work_dir=work, root=layout.rootfs,
                        mounts=bundle.external_mounts(layout),
                        netns=network.netns_path(self.runc.node, record.id),
                        cgroup=self.runc.cgroups_path(record.id), lazy_pages=transfer is not None,
                        timeout_s=self.restore_timeout_s,
                    )
                )  # fmt: skip
                pid_file.write_text(str(pid))
                return pid
            with (
                failure_logged(f"CRIU restore of sandbox {record.id}", work / "restore.log"),
                self.runc.making_cgroups(),
            ):
                self.runc.runc(
                    "restore", "--detach", "--tcp-established", "--file-locks",
                    *(["--lazy-pages"] if transfer is not None else []),
                    "--image-path", str(images_dir), "--work-path", str(work), "--pid-file", str(pid_file),
                    "--bundle", str(layout.bundle), record.id, timeout=self.restore_timeout_s,
                )  # fmt: skip
        except CommandFailed as exc:
            if transfer is not None:
                transfer.abort()
                if transfer.failure is not None:  # the memory could not be had: that is the cause
                    raise transfer.failure from exc
            raise
        return int(pid_file.read_text())  # runc wrote the pid it restored


def _restore_work(layout: SandboxLayout) -> Path:
    work = layout.criu_work / "restore"
    work.mkdir(parents=True, exist_ok=True)
    return work
