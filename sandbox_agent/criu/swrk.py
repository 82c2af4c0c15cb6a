"""CRIU driven over its RPC (`criu swrk`, protos/criu/rpc.proto), as runc drives it, without runc.

One call is one `criu swrk` process and one request on a socket pair. A caller that must place
CRIU first (a restore's tasks are forked by CRIU and stay in its cgroups) gets its pid before
the request goes out. CRIU answers once the dump or restore is done; it may first send
notifications, each acknowledged here, since no scripts are run for them.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from protos.criu import rpc_pb2 as rpc
from sandbox_agent.errors import CommandFailed, ToolUnavailable

MAX_MESSAGE = 1 << 20


def call(
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
