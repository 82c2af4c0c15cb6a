"""CRIU as a node drives it: one core (`Criu`) over its RPC (`swrk`), one method per action, as
pycriu has it. Every request CRIU is sent, and every option in it, is built here, and sent here.

A dump or restore is asked of CRIU with the options runc would give it (runc's names for the
sandbox's external mounts and its netns), so a snapshot runc dumped restores the same way. CRIU
refusing, dying or hanging raises `CommandFailed` with the tail of its log.

The transport (`swrk`) is CRIU's RPC (protos/criu/rpc.proto) as runc drives it, without runc:
one call is one `criu swrk` process and one request on a socket pair. A caller that must place
CRIU first (a restore's tasks are forked by CRIU and stay in its cgroups) gets its pid before
the request goes out. CRIU answers once the dump or restore is done; it may first send
notifications, each acknowledged there, since no scripts are run for them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from protos.criu import rpc_pb2 as rpc
from sandbox_agent.criu import lazy
from sandbox_agent.errors import CommandFailed, ToolUnavailable
from sandbox_agent.host import cgroups, tools

EXTERNAL_NETNS = "extRootNetNS"
"""The name a dump gives the sandbox's netns, which the node owns, and a restore hands CRIU back
(runc's name: a snapshot runc dumped restores the same way)."""

DEVICES = ("/dev/null", "/dev/random", "/dev/full", "/dev/tty", "/dev/zero", "/dev/urandom")
"""The device nodes runc puts in every sandbox's /dev: bind mounts of the host's in a user namespace."""

LOG_LEVEL = 2
"""CRIU logs its errors and warnings only, where runc asks for every step (level 4): that took
about 4 ms of a 64 MiB freeze (raw `criu dump`, medians of 4: 57 ms at level 4, 53 ms at level 2)
and 1.5-3.7 ms of a 64 MiB restore's 20-26 ms in CRIU (three runs of 12 restores each way)."""

DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"

MAX_MESSAGE = 1 << 20
"""The largest message read from CRIU's socket, in bytes (1 MiB)."""


@dataclass(frozen=True)
class Mounts:
    """A sandbox's external mounts as runc names them: its bind mounts by their destination (with
    their source on the node), runc's device nodes, and each masked path (a /dev/null mount)."""

    binds: tuple[tuple[str, str], ...]
    """(destination, source) of every bind mount in the sandbox's OCI spec."""
    masked: tuple[str, ...] = ()
    """The spec's masked paths; the files among them are /dev/null mounts."""


@dataclass(frozen=True)
class DumpOptions:
    """One dump of a sandbox's processes (`Criu.dump`)."""

    sandbox_id: str
    pid: int
    """The sandbox's init, as the node sees it."""
    images_dir: Path
    work_dir: Path
    """Where CRIU writes its log and its stats of the dump (`stats`)."""
    root: Path
    mounts: Mounts
    netns: Path
    freeze_cgroup: Path
    """The sandbox's freezer cgroup, which CRIU freezes itself."""
    leave_running: bool
    """False: CRIU kills the tasks once their images are written."""
    timeout_s: float = 600.0


@dataclass(frozen=True)
class RestoreOptions:
    """One restore of a sandbox's processes (`Criu.restore`)."""

    sandbox_id: str
    images_dir: Path
    work_dir: Path
    root: Path
    mounts: Mounts
    netns: Path
    cgroup: str
    """The sandbox's cgroups, which CRIU joins before it forks a task."""
    lazy_pages: bool
    """The memory arrives from a lazy-pages daemon as the tasks touch it (`lazy.Transfer`)."""
    timeout_s: float


class Criu:
    """CRIU's binary and the configuration file every request names; one method per action."""

    def __init__(self, binary: str = "criu", config_file: Path | None = None) -> None:
        self.binary = binary
        self.config_file = config_file
        """CRIU's own options that runc also reads (`org.criu.config`): tcp-close, cgroups..."""

    def version(self) -> str:
        out = tools.run([self.binary, "--version"], what="criu --version").stdout.decode()
        for line in out.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        return out.strip()

    def dump(self, opts: DumpOptions) -> None:
        """Dump the sandbox's tasks into `opts.images_dir`; CRIU freezes them itself."""
        rpc_opts = self._shared(opts.root, opts.mounts, DUMP_LOG)
        rpc_opts.pid = opts.pid
        rpc_opts.leave_running = opts.leave_running
        rpc_opts.freeze_cgroup = str(opts.freeze_cgroup)
        rpc_opts.external.append(f"net[{opts.netns.stat().st_ino}]:{EXTERNAL_NETNS}")
        root = Path(f"/proc/{opts.pid}/root")
        masked = [p for p in opts.mounts.masked if _is_file(root / p.lstrip("/"))]
        rpc_opts.ext_mnt.extend(rpc.ext_mount_map(key=p, val="/dev/null") for p in masked)
        rpc_opts.ext_mnt.extend(rpc.ext_mount_map(key=dest, val=dest) for dest, _ in _external(opts.mounts))
        opts.images_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        what = f"CRIU dump of sandbox {opts.sandbox_id}"
        with (
            failure_logged(what, opts.work_dir / DUMP_LOG),
            _open_dirs(opts.images_dir, opts.work_dir) as fds,
        ):
            rpc_opts.images_dir_fd, rpc_opts.work_dir_fd = fds
            swrk(
                self.binary, rpc.criu_req(type=rpc.DUMP, opts=rpc_opts), what=what,
                timeout_s=opts.timeout_s, pass_fds=fds,
            )  # fmt: skip

    def restore(self, opts: RestoreOptions) -> int:
        """Restore the sandbox's tasks, in its cgroups and netns; returns its init's pid."""
        rpc_opts = self._shared(opts.root, opts.mounts, RESTORE_LOG)
        rpc_opts.lazy_pages = opts.lazy_pages
        mounts = [*_external(opts.mounts), ("/dev/null", "/dev/null")]
        rpc_opts.ext_mnt.extend(rpc.ext_mount_map(key=dest, val=src) for dest, src in mounts)
        what = f"CRIU restore of sandbox {opts.sandbox_id}"
        netns = os.open(opts.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            rpc_opts.inherit_fd.append(rpc.inherit_fd(key=EXTERNAL_NETNS, fd=netns))
            with (
                failure_logged(what, opts.work_dir / RESTORE_LOG),
                _open_dirs(opts.images_dir, opts.work_dir) as fds,
            ):
                rpc_opts.images_dir_fd, rpc_opts.work_dir_fd = fds
                answer = swrk(
                    self.binary, rpc.criu_req(type=rpc.RESTORE, opts=rpc_opts), what=what,
                    timeout_s=opts.timeout_s, pass_fds=(*fds, netns),
                    placed=lambda pid: cgroups.enter(opts.cgroup, pid),
                )  # fmt: skip
        finally:
            os.close(netns)
        return int(answer.restore.pid)

    def lazy_pages(self, images: Path, work: Path, server: lazy.PageServer, *, hold: bool) -> lazy.Daemon:
        """Start CRIU's lazy-pages daemon for one restore, fed by `server`; with `hold`, only
        the pages faulted on until it is released."""
        return lazy.Daemon(self.binary, images, work, server, hold=hold)

    def _shared(self, root: Path, mounts: Mounts, log_file: str) -> rpc.criu_opts:
        """The options a dump and a restore share."""
        opts = rpc.criu_opts(
            images_dir_fd=-1, log_level=LOG_LEVEL, log_file=log_file, root=str(root),
            tcp_established=True, file_locks=True, evasive_devices=True,
            manage_cgroups_mode=rpc.IGNORE,
        )  # fmt: skip
        if self.config_file is not None:
            opts.config_file = str(self.config_file)
        return opts


def _external(mounts: Mounts) -> list[tuple[str, str]]:
    return [*mounts.binds, *((d, d) for d in DEVICES)]


@contextmanager
def failure_logged(what: str, log_file: Path) -> Iterator[None]:
    """A `CommandFailed` raised inside carries the tail of CRIU's log."""
    try:
        yield
    except CommandFailed as exc:
        raise exc.with_log(f"{what} failed", log_tail(log_file)) from exc


def log_tail(path: Path, lines: int = 25) -> str:
    """The errors CRIU logged, then the last lines of its log."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in text if "Error" in line or "error" in line]
    return "\n".join(([*errors[-8:], "..."] if errors else []) + text[-lines:])


def _is_file(path: Path) -> bool:
    """Whether path, as the sandbox's root resolves it, is there and is not a directory."""
    try:
        return not path.is_dir() and path.exists()
    except OSError:
        return False


@contextmanager
def _open_dirs(*paths: Path) -> Iterator[tuple[int, int]]:
    """Descriptors of the images and work directories, for CRIU to inherit, closed after."""
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        yield fds[0], fds[1]
    finally:
        for fd in fds:
            os.close(fd)


def swrk(
    criu: str,
    request: rpc.criu_req,
    *,
    what: str,
    timeout_s: float,
    pass_fds: Sequence[int] = (),
    placed: Callable[[int], None] | None = None,
) -> rpc.criu_resp:
    """Send `request` to a new `criu swrk` and return its answer. `placed(pid)` runs before the
    request is sent. CRIU's refusal, its death, or no answer within `timeout_s` (it is killed
    then) raise CommandFailed, whose log the caller adds from CRIU's work dir."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = (criu, "swrk", str(theirs.fileno()))
    try:
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(), *pass_fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise ToolUnavailable(f"{criu} is not installed or not on PATH") from exc
        finally:
            theirs.close()  # CRIU's end: if it dies, a read here ends instead of waiting
        try:
            if placed is not None:
                placed(proc.pid)
            answer = _exchange(ours, request, time.monotonic() + timeout_s)
        except BaseException as exc:
            proc.kill()
            proc.wait()
            if isinstance(exc, TimeoutError):
                raise CommandFailed(
                    argv=argv, returncode=-1, stderr_tail="", what=what, timeout_s=timeout_s
                ) from None
            raise
    finally:
        ours.close()
    if answer is None:
        code = proc.wait()
        raise CommandFailed(
            argv=argv, returncode=code, stderr_tail="CRIU exited without answering", what=what
        )
    try:
        code = proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if not answer.success:
        detail = answer.cr_errmsg or (f"errno {answer.cr_errno}" if answer.cr_errno else "")
        raise CommandFailed(argv=argv, returncode=code or -1, stderr_tail=detail, what=what)
    return answer


def _exchange(sock: socket.socket, request: rpc.criu_req, deadline: float) -> rpc.criu_resp | None:
    """Send the request and return CRIU's answer, acknowledging its notifications; None if CRIU
    hung up first. Raises TimeoutError past the deadline."""
    try:
        sock.sendall(request.SerializeToString())
    except BrokenPipeError:
        return None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        try:
            data = sock.recv(MAX_MESSAGE)
        except ConnectionResetError:  # CRIU exited with the request unread
            return None
        if not data:
            return None
        answer = rpc.criu_resp.FromString(data)
        if answer.type != rpc.NOTIFY:
            return answer
        try:
            sock.sendall(rpc.criu_req(type=rpc.NOTIFY, notify_success=True).SerializeToString())
        except (BrokenPipeError, ConnectionResetError):  # CRIU died after it asked
            return None
