"""The C library, for the system calls Python's `os` lacks here (mounts, namespaces, fs ids)."""

from __future__ import annotations

import ctypes
import os

from sandbox_agent.errors import FailedPrecondition

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> int:
    """A libc call's result; FailedPrecondition naming `what` and the error if the call failed."""
    if result < 0:
        raise FailedPrecondition(f"{what}: {os.strerror(ctypes.get_errno())}")
    return result
