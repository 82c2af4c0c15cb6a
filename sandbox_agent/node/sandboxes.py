"""The sandboxes of one node as records and directories, and which of them an operation holds.

A sandbox lives in two directories: `<root>/sandboxes/<id>` (its record, its writable layer,
CRIU's work), which only root may enter, and `<run dir>/<node>/<id>`, what its unprivileged
host ids must reach (its root filesystems). Its record (`sandbox.json`) is written first and
removed last, so a directory without one is a sandbox half made or half removed.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sandbox_agent.errors import AlreadyExists, Busy, FailedPrecondition, NotFound
from sandbox_agent.host import confined, network, overlay
from sandbox_agent.node.disk import DiskBudget
from sandbox_agent.runtime.backend import EXIT_CODE, Backend, SandboxLayout
from sandbox_agent.spec import SandboxRecord, SandboxState, SandboxStatus, validate_id

T = TypeVar("T")


class Sandboxes:
    """Every sandbox's record and layout on one node; safe to call from many threads."""

    def __init__(
        self, node: str, host_key: str, backend: Backend, root: Path, reachable_dir: Path, disk: DiskBudget
    ) -> None:
        self.node = node
        self.host_key = host_key
        """What names the sandboxes' netns and veths on the host (`AgentSettings.host_key`)."""
        self.backend = backend
        self.disk = disk
        """Every sandbox here holds its layer's room from `new` until `teardown`."""
        self.dir = root
        self.dir.mkdir(exist_ok=True)
        # Harnesses' layers lie there as the sandboxes see them: no other user of the node reaches them.
        self.dir.chmod(0o700)
        self.reachable_dir = reachable(reachable_dir)
        self._lock = threading.Lock()
        self._busy: set[str] = set()

    def recover(self) -> tuple[set[str], set[str]]:
        """After a crash: remove the directories of sandboxes that have no record; the ids of
        those that have one, and of those removed."""
        known: set[str] = set()
        unrecorded: set[str] = set()
        for d in self.dir.iterdir():
            if d.name.startswith(".") or not (d / "sandbox.json").exists():
                remove(self.layout(d.name))
                unrecorded.add(d.name)
                continue
            known.add(d.name)
            self.disk.hold(d.name, self.record(d.name).spec.resources, admit=False)
        for d in self.reachable_dir.iterdir():
            if d.name not in known:
                remove(self.layout(d.name))
                unrecorded.add(d.name)
        return known, unrecorded

    def layout(self, sandbox_id: str) -> SandboxLayout:
        # Every request names its sandbox by id: one like '../x' or 'a/layer/upper' would reach
        # outside the sandboxes' directory, into a tree a harness controls.
        validate_id("sandbox_id", sandbox_id)
        return SandboxLayout(self.dir / sandbox_id, self.reachable_dir / sandbox_id)

    def record(self, sandbox_id: str) -> SandboxRecord:
        path = self.layout(sandbox_id).record
        try:
            return SandboxRecord.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise NotFound(f"sandbox {sandbox_id!r} does not exist on node {self.node}") from None

    def ids(self) -> list[str]:
        return sorted(d.name for d in self.dir.iterdir())

    @contextmanager
    def exclusive(self, sandbox_id: str) -> Iterator[None]:
        """One operation at a time per sandbox; a concurrent one is refused, not queued."""
        with self._lock:
            if sandbox_id in self._busy:
                raise Busy(f"sandbox {sandbox_id!r} on node {self.node} is busy with another operation")
            self._busy.add(sandbox_id)
        try:
            yield
        finally:
            self.done(sandbox_id)

    @contextmanager
    def new(
        self,
        sandbox_id: str,
        record: SandboxRecord,
        *,
        keep_busy: bool = False,
        alongside: Callable[[SandboxLayout], None] | None = None,
    ) -> Iterator[SandboxLayout]:
        """Reserve the id, make the sandbox's network (and run `alongside` meanwhile, in another
        thread), and undo everything if building the sandbox fails. With `keep_busy`, the
        sandbox stays busy when built, until the caller calls `done`."""
        layout = self.layout(sandbox_id)
        if record.spec.egress and not self.backend.wants_netns:
            raise FailedPrecondition(
                f"node {self.node} runs {self.backend.name}, whose sandboxes have no network of Stasis's "
                "making; egress needs the runc backend"
            )
        with self._lock:
            if layout.dir.exists() or sandbox_id in self._busy:
                raise AlreadyExists(f"sandbox {sandbox_id!r} already exists on node {self.node}")
            self.disk.hold(sandbox_id, record.spec.resources)
            layout.dir.mkdir(parents=True)
            reachable(layout.reachable)
            self._busy.add(sandbox_id)
        try:
            record.save(layout.record)
            meanwhile = in_thread(lambda: alongside(layout), f"build-{sandbox_id}") if alongside else None
            try:
                if self.backend.wants_netns:
                    network.create(self.host_key, sandbox_id, record.spec.address)
                    if record.spec.egress:
                        network.allow_egress(
                            self.host_key, sandbox_id, record.spec.address, record.spec.egress
                        )
            finally:
                if meanwhile is not None:
                    wait([meanwhile])  # nothing is undone under it
            if meanwhile is not None:
                meanwhile.result()
            yield layout
        except BaseException:
            self.teardown(record, layout)
            self.done(sandbox_id)
            raise
        if not keep_busy:
            self.done(sandbox_id)

    def done(self, sandbox_id: str) -> None:
        with self._lock:
            self._busy.discard(sandbox_id)

    def teardown(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        """Remove the sandbox's container, network and directories (its processes must be gone)."""
        try:
            self.backend.destroy(record, layout)
        finally:
            network.destroy(self.host_key, record.id)
            if record.spec.egress:
                network.revoke_egress(self.host_key, record.id)
            remove(layout)
            self.disk.release(record.id)

    def status(self, record: SandboxRecord) -> SandboxStatus:
        layout = self.layout(record.id)
        state, pid = self.backend.status(record, layout)
        exit_code = None
        if state == SandboxState.EXITED:
            # The harness owns this file: it may be a symlink, a fifo or endless; read a few bytes.
            code = confined.read(self.backend.upper_dir(record, layout), EXIT_CODE, limit=16)[0]
            try:
                exit_code = int(code.strip())
            except ValueError:
                exit_code = None
            if exit_code is not None and not 0 <= exit_code <= 255:
                exit_code = None  # not what the wrapper's `echo $?` writes: the harness wrote it
        with self._lock:
            busy = record.id in self._busy
        return SandboxStatus(record=record, state=state, pid=pid, exit_code=exit_code, busy=busy)


def partial(sandbox_id: str) -> str:
    """How the name of a checkpoint's staging directory begins, before its random suffix."""
    return f".{sandbox_id}.partial-"


def remove(layout: SandboxLayout) -> None:
    """A sandbox's directories gone, everything mounted in them unmounted first: a verifier's view
    of it, its id-mapped trees, its layer's filesystem (the loop device goes with it)."""
    overlay.unmount_below(layout.reachable, layout.dir)
    shutil.rmtree(layout.reachable, ignore_errors=True)
    shutil.rmtree(layout.dir, ignore_errors=True)


def reachable(path: Path) -> Path:
    """Make a directory that anyone may pass through but not list: where sandboxes, whose ids are
    unprivileged on the host, find their root filesystems."""
    for d in reversed([path, *path.parents]):
        if not d.exists():
            d.mkdir(exist_ok=True)
            d.chmod(0o711)
        elif not d.stat().st_mode & 0o001:
            raise FailedPrecondition(
                f"{d} is not searchable by others, so sandboxes (unprivileged host ids) could not "
                f"reach their root filesystems under {path}: choose another --run-dir, or chmod o+x {d}"
            )
    return path


def in_thread(fn: Callable[[], T], name: str) -> Future[T]:
    """Run fn in a thread of its own; its result, or what it raised, in the future returned."""
    future: Future[T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
