"""One process at a time on a state dir's embedded database: its orchestrator, or a migration.

The SQLite store has no lease to fence a second writer (`SoleLease`), so whoever uses a state dir's
`state.db` as its own holds an advisory lock on `<state dir>/owner.lock` until it stops. The
kernel drops the lock with the process, however it ends, so a crash never leaves it held.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from orchestrator.domain import FailedPrecondition

LOCK_FILE = "owner.lock"


class StateDirLock:
    """Holds `<state_dir>/owner.lock` for `holder` (who, for people), or raises FailedPrecondition
    naming the process that holds it."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        path = state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held_by = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FailedPrecondition(
                f"the state dir {state_dir} is in use by {held_by}; stop it first"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()})\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None
