"""The host's vm.unprivileged_userfaultfd, set to 1 only while some agent of the host restores
lazily in a user namespace (`UserfaultfdGrant`)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

UNPRIVILEGED_USERFAULTFD = Path("/proc/sys/vm/unprivileged_userfaultfd")


class UserfaultfdGrant:
    """vm.unprivileged_userfaultfd=1 while some agent on this host may restore lazily, and the
    host's own value back once the last of them stops.

    The tasks CRIU restores in a user namespace open a userfaultfd holding no capability of the
    host's, which the kernel allows only with that sysctl at 1. Sandboxes still cannot: their
    seccomp filter refuses the call. But every other unprivileged process of the host may while
    it is 1, so it is 1 no longer than needed: each agent holds a shared lock on `lock`.holders
    while it needs it, and the one that finds itself alone at its end writes back the value the
    first had found, which `prior` keeps (in /run, so across an agent's crash but not a reboot, which
    resets the sysctl anyway)."""

    def __init__(
        self,
        sysctl: Path = UNPRIVILEGED_USERFAULTFD,
        lock: Path = Path("/run/stasis-userfaultfd.lock"),
        prior: Path = Path("/run/stasis-userfaultfd.prior"),
    ) -> None:
        self._sysctl, self._lock, self._prior = sysctl, lock, prior
        self._holders = lock.with_name(lock.name + ".holders")
        """Each agent that holds the grant holds a shared lock on it."""
        self._held: int | None = None

    def acquire(self) -> str:
        """Set the sysctl to 1 for as long as this grant is held; "" when done, else why not."""
        try:
            with self._turn():
                if not self._prior.exists():  # no agent has it: what is there is the host's own
                    self._prior.write_text(self._sysctl.read_text())
                if self._sysctl.read_text().strip() != "1":
                    self._sysctl.write_text("1\n")
                fd = os.open(self._holders, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:
            return f"cannot set {self._sysctl} to 1: {exc.strerror or exc}"
        self._held = fd
        return ""

    def release(self) -> None:
        """Give the grant up; the last holder on the host puts the host's value back."""
        if self._held is None:
            return
        try:
            with self._turn():
                os.close(self._held)
                self._held = None
                fd = os.open(self._holders, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another agent still holds it
                finally:
                    os.close(fd)
                if self._prior.exists():
                    self._sysctl.write_text(self._prior.read_text())
                    self._prior.unlink()
        except OSError as exc:
            log.warning("cannot put %s back: %s", self._sysctl, exc)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One agent of the host at a time takes or gives up a grant."""
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
