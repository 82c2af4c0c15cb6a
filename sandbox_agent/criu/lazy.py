"""Lazy restore: a restored sandbox runs before its memory is on this node.

CRIU marks most anonymous memory of a dump as lazy (`PE_LAZY` in its pagemap images). A lazy
restore (`runc restore --lazy-pages`) maps those pages empty and registers them with
userfaultfd; CRIU's lazy-pages daemon fills each page on its first touch, copies the rest in the
background meanwhile, and exits once every page is in. Here the daemon gets its pages from
`PageServer`, which speaks CRIU's page-server protocol on one end of a socket pair (nothing
listens on the network) and reads them straight from the snapshot store (`StoredFile`): each
request fetches only the chunks under it, every chunk verified against its hash as it arrives.
What the restore itself reads (the small images, and the pages CRIU keeps eager: stacks, the
vDSO's neighbours) is written first, by `prepare`.

A transfer may be held (`Transfer(hold=True)`, CRIU's `--lazy-pages-hold`, a Stasis patch): the
daemon then fetches only the pages the sandbox faults on, and nothing in the background, until
`release`, or until the sandbox faulted HELD_BYTES in (it is busy, not idle). A fork's idle
children so hold what they touch, not a copy of the parent's memory each. A held sandbox's memory
is incomplete for as long as it runs held: whatever reads all of it (a checkpoint) releases it
first and waits for the rest.

Which pages are lazy, and where each lies, CRIU's pagemap images say (`pagemap`).

A page that cannot be served (a chunk missing or corrupt, the store unreachable, the daemon
gone) must never leave the sandbox running on memory it does not have: the page server kills the
sandbox before it answers the daemon, and the caller then removes it and reports the restore
failed. The snapshot is untouched, so the restore can be tried again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from sandbox_agent.criu.pagemap import PAGE, PE_PRESENT, Memory, memories
from sandbox_agent.errors import ToolUnavailable

log = logging.getLogger(__name__)


# CRIU's page-server protocol (criu/page-xfer.c): a request or answer is this header; an answer
# to PS_IOV_GET is followed by its pages.
HEADER = struct.Struct("<I4xQQQ")  # cmd, nr_pages, vaddr, dst_id
PS_IOV_ADD_F = 6
PS_IOV_GET = 7
PS_IOV_CLOSE = 0x1023
PS_IOV_FORCE_CLOSE = 0x1024
PS_CMD_BITS = 16
HELD_BYTES = 32 << 20
"""A held transfer is released once its sandbox faulted this much in: it is busy, not idle, and
would touch the rest page by page, each a round trip through the page server."""
SOCKET_WAIT_S = 10.0
"""How long the lazy-pages daemon may take to open the socket the restore hands it tasks on."""


class Readable(Protocol):
    """A file of the snapshot, read at any offset (`snapshots.StoredFile`)."""

    size: int

    def read_views(self, offset: int, length: int) -> list[memoryview]:
        """`length` bytes from `offset`, as views of the verified chunks they lie in."""


class ReadableMany(Readable, Protocol):
    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several ranges at once, their chunks fetched together."""


def prepare(images: Path, stored: Callable[[str], ReadableMany]) -> dict[int, Memory]:
    """Write into the (sparse) pages files what a lazy restore reads itself: the processes'
    non-lazy runs, and every pages file of shared memory whole. `stored(name)` is the
    snapshot's file of that name in the images directory. Returns the processes' memory."""
    tasks, others = memories(images)
    writes: dict[str, list[tuple[int, int]]] = {name: [(0, stored(name).size)] for name in others}
    for memory in tasks.values():
        if memory.pages_file not in others:
            eager = [(r.offset, r.pages * PAGE) for r in memory.runs if not r.lazy]
            writes.setdefault(memory.pages_file, []).extend(eager)
    for name, ranges in writes.items():
        with open(images / name, "r+b") as f:
            for batch in _batches(ranges):
                for (offset, _), data in zip(batch, stored(name).read_many(batch), strict=True):
                    f.seek(offset)
                    f.write(data)
    return tasks


PREPARE_BATCH_BYTES = 32 << 20
"""What `prepare` holds in memory at once: a sandbox decides how much of its memory CRIU restores
itself (shared memory, locked pages), so it is read and written in pieces of this size."""


def _batches(
    ranges: list[tuple[int, int]], limit: int = PREPARE_BATCH_BYTES
) -> Iterator[list[tuple[int, int]]]:
    """`ranges` cut into pieces of at most `limit` bytes, grouped at most `limit` bytes a group."""
    batch: list[tuple[int, int]] = []
    held = 0
    for offset, length in ranges:
        for start in range(offset, offset + length, limit):
            piece = min(limit, offset + length - start)
            if held + piece > limit:
                yield batch
                batch, held = [], 0
            batch.append((start, piece))
            held += piece
    if batch:
        yield batch


class PageServer:
    """Serves the lazy-pages daemon its pages from the snapshot store, on a thread of its own.

    `fault(message)` is called, before the daemon hears of it, when a page cannot be served;
    it must stop the sandbox. `error` then says why, and `done` is set either way. `busy()` is
    called once it served `busy_after` bytes: a held transfer is then released (`Transfer`).
    """

    def __init__(
        self,
        memory: Future[dict[int, Memory]],
        stored: Callable[[str], Readable],
        fault: Callable[[str], None],
        busy: Callable[[], None] = lambda: None,
        busy_after: int = 0,
    ) -> None:
        self._memory = memory
        """The processes' memory, as `prepare` gives it: no page is asked for before CRIU's
        restore, which waits for it (`Transfer.ready`)."""
        self._stored = stored
        self._fault = fault
        self._busy = busy
        self._busy_after = busy_after
        self.served = 0
        """Bytes of pages served so far."""
        self._ours, self.theirs = socket.socketpair()
        self.failure: Exception | None = None
        """Why a page could not be served (the snapshot store's own error, when it was the cause)."""
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="lazy-pages", daemon=True)

    def start(self) -> PageServer:
        self._thread.start()
        return self

    @property
    def error(self) -> str:
        return f"lazy restore could not serve memory: {self.failure}" if self.failure else ""

    def stop(self) -> None:
        """Hang up (the daemon then fails, if it still wanted pages) and wait for the thread."""
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)
        self._ours.close()
        self.theirs.close()

    def _serve(self) -> None:
        try:
            while True:
                header = self._receive(HEADER.size)
                if header is None:
                    return  # the daemon hung up: it has every page, or it failed on its own
                cmd, pages, vaddr, dst = HEADER.unpack(header)
                if cmd in (PS_IOV_CLOSE, PS_IOV_FORCE_CLOSE):
                    self._ours.sendall(struct.pack("<i", 0))
                    return
                if cmd & ((1 << PS_CMD_BITS) - 1) != PS_IOV_GET:
                    raise ValueError(f"the lazy-pages daemon sent command {cmd:#x}, not a page request")
                self._send(dst, vaddr, pages)  # the daemon names a process by its pid alone
        except Exception as exc:  # every way of failing ends the sandbox first
            self.failure = exc
            log.error("%s; stopping the sandbox", self.error)
            try:
                self._fault(self.error)
            finally:
                self._ours.close()
        finally:
            self.done.set()

    def _send(self, pid: int, vaddr: int, pages: int) -> None:
        memory = self._memory.result().get(pid)
        run = memory.find(vaddr) if memory else None
        if memory is None or run is None:
            raise ValueError(f"process {pid} has no pages at {vaddr:#x} in the snapshot")
        first = (vaddr - run.vaddr) // PAGE
        count = min(pages, run.pages - first)
        views = self._stored(memory.pages_file).read_views(run.offset + first * PAGE, count * PAGE)
        answer = HEADER.pack((PE_PRESENT << PS_CMD_BITS) | PS_IOV_ADD_F, count, vaddr, pid)
        _send_all(self._ours, [memoryview(answer), *views])
        before, self.served = self.served, self.served + count * PAGE
        if before < self._busy_after <= self.served:
            self._busy()

    def _receive(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            more = self._ours.recv(size - len(data))
            if not more:
                return None
            data += more
        return data


def _send_all(sock: socket.socket, views: list[memoryview]) -> None:
    """Send the views one after another, gathered by the kernel: an answer's pages go as the
    store's chunks hold them, where joining and slicing them copied every byte twice (a lazy
    restore's memory arrived about a fifth sooner without)."""
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


_IOV_MAX = 1024
"""The most pieces one sendmsg takes (Linux's UIO_MAXIOV)."""


class Daemon:
    """CRIU's lazy-pages daemon for one restore, fed by a `PageServer`."""

    def __init__(
        self, criu: str, images: Path, work: Path, server: PageServer, *, hold: bool = False
    ) -> None:
        self.work = work
        self.log = work / "lazy-pages.log"
        fd = server.theirs.fileno()
        self.process = subprocess.Popen(
            [
                criu, "lazy-pages", "--images-dir", str(images), "--work-dir", str(work),
                "--page-server", "--ps-socket", str(fd), "--log-file", self.log.name, "-v2",
                *(["--lazy-pages-hold"] if hold else []),
            ],
            pass_fds=[fd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,  # a group of its own, which `stop` kills whole
        )  # fmt: skip
        server.theirs.close()  # the daemon holds its end now

    def release(self) -> None:
        """End a hold: the daemon then fetches the rest of the memory in the background. The
        daemon blocks the signal from its start, before the socket `wait_ready` waits for."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGUSR1)

    def wait_ready(self) -> None:
        """Until the daemon listens for the restore's tasks (its socket in the work dir)."""
        deadline = time.monotonic() + SOCKET_WAIT_S
        while not (self.work / "lazy-pages.socket").exists():
            if self.process.poll() is not None:
                raise ToolUnavailable(f"CRIU's lazy-pages daemon exited at start: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise ToolUnavailable(f"CRIU's lazy-pages daemon did not start in {SOCKET_WAIT_S:.0f} s")
            time.sleep(0.002)

    def log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Kill the daemon and what it forked. CRIU probes the kernel as it starts, in children
        that stop themselves under its ptrace: killed then, it left one stopped for good."""
        if self.process.returncode is None:  # not reaped: its pid still names its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class DaemonStarter(Protocol):
    """What starts CRIU's lazy-pages daemon (`core.Criu`)."""

    def lazy_pages(self, images: Path, work: Path, server: PageServer, *, hold: bool) -> Daemon: ...


class Transfer:
    """One lazy restore's memory, from the restore's start until every page is in: the page
    server and CRIU's daemon. `fault(message)` must stop the sandbox (see `PageServer`)."""

    def __init__(
        self,
        memory: Future[dict[int, Memory]],
        stored: Callable[[str], Readable],
        fault: Callable[[str], None],
        *,
        hold: bool = False,
    ) -> None:
        self.memory = memory
        """`prepare`'s result: the restore's other work goes on while it writes the pages CRIU
        restores itself."""
        self.server = PageServer(
            memory, stored, fault, busy=self.release, busy_after=HELD_BYTES if hold else 0
        )
        self.daemon: Daemon | None = None
        self.hold_asked = hold
        """Whether it was started held (its sandbox is not busy while its memory arrives)."""
        self.held = hold
        """Whether only the pages faulted on arrive, until `release`."""
        self.abandoned = False
        """Stopped because its sandbox went (`abandon`): no page was missed."""

    def start(self, criu: DaemonStarter, images: Path, work: Path) -> None:
        """Serve, and start the daemon for the restore's tasks (`runc restore --lazy-pages
        --work-path work`: they meet on a socket in that directory); `ready` waits for it."""
        self.server.start()
        self.daemon = criu.lazy_pages(images, work, self.server, hold=self.held)

    def release(self) -> None:
        """Let the rest of the memory arrive, if it was held."""
        if self.held and self.daemon is not None:
            self.daemon.release()
        self.held = False

    def ready(self) -> None:
        """Until the memory is prepared and the daemon listens for the restore's tasks; if
        either fails (the first with its own error), stop everything."""
        assert self.daemon is not None
        try:
            self.memory.result()
            self.daemon.wait_ready()
        except BaseException:
            self.abort()
            raise

    @property
    def error(self) -> str:
        return self.server.error

    @property
    def failure(self) -> Exception | None:
        return self.server.failure

    def wait(self) -> str:
        """Block until the daemon is done: "" once every page is in, else what went wrong."""
        assert self.daemon is not None
        code = self.daemon.process.wait()
        self.server.stop()
        if self.server.error:
            return self.server.error
        if code != 0:
            return f"CRIU's lazy-pages daemon failed (exit {code}): {self.daemon.log_tail()}"
        return ""

    def abandon(self) -> None:
        """Stop the transfer of a sandbox that is gone. CRIU's daemon hears nothing of a
        process's exit while it is held: it would wait for faults for good."""
        self.abandoned = True
        self.abort()

    def abort(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.server.stop()
