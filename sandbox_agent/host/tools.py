"""The one runner for runc, criu, tar, ip and friends: argv only, never a shell."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from sandbox_agent.errors import CommandFailed, ToolUnavailable

log = logging.getLogger(__name__)

DEVNULL = subprocess.DEVNULL

STDERR_TAIL_BYTES = 4096
"""How much of a failing command's stderr an error carries: enough for CRIU's last lines."""


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    duration_ms: float
    stdout: bytes
    stderr_tail: str


def tail(text: bytes | str, limit: int = STDERR_TAIL_BYTES) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text[-limit:].strip()


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 600,
    input: bytes | None = None,
    stdin: IO[bytes] | int | None = None,
    stdout: IO[bytes] | int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    what: str = "",
) -> Completed:
    """Run argv and record how it went; raise CommandFailed on a non-zero exit if check."""
    args = tuple(str(a) for a in argv)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            args,
            input=input,
            stdin=stdin if input is None else None,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ToolUnavailable(f"{args[0]} is not installed or not on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(
            argv=args, returncode=-1, stderr_tail=tail(exc.stderr or b""), what=what, timeout_s=timeout
        ) from exc
    duration_ms = (time.monotonic() - started) * 1000
    stderr = tail(proc.stderr or b"")
    log.debug("ran %s -> %d in %.1f ms", args, proc.returncode, duration_ms)
    if check and proc.returncode != 0:
        raise CommandFailed(argv=args, returncode=proc.returncode, stderr_tail=stderr, what=what)
    return Completed(args, proc.returncode, duration_ms, proc.stdout or b"", stderr)


@contextmanager
def held(argv: Sequence[str], *, what: str = "") -> Iterator[subprocess.Popen[bytes]]:
    """Run argv in the background while the body needs it (a namespace's holder, say); kill it after."""
    args = tuple(str(a) for a in argv)
    try:
        proc = subprocess.Popen(args, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
    except FileNotFoundError as exc:
        raise ToolUnavailable(f"{args[0]} is not installed or not on PATH") from exc
    log.debug("holding %s (%s) as pid %d", args, what, proc.pid)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
