"""Store locks: writers and readers share, GC excludes (restic's protocol, safe on S3 and shared dirs).

Each side first writes its own lock object, then lists all locks. With
read-after-write and list-after-write consistency, of two racing parties at
least the later lister sees the other's lock, so a writer and a sweep can
never both proceed. See docs/snapshot-format.md for the full argument.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

from ._backends import Backend, ObjectMissing
from ._errors import SnapshotError, StoreLocked
from ._settings import LockSettings

LOCK_PREFIX = "locks/"


class LockKind(enum.StrEnum):
    """Shared locks (put, fetch, verify) coexist; an exclusive lock (GC sweep) coexists with nothing."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: enough to tell, on the same host, whether the process still lives."""

    host: str
    boot_id: str
    pidns: str
    pid: int

    @staticmethod
    def current() -> Holder:
        """The calling process."""
        return Holder(socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), _pidns(), os.getpid())

    def dead(self, here: Holder) -> bool:
        """True only when certain: same host, same boot, same PID namespace, and no such process.

        Another boot id proves nothing: pods and machines share host names, so the holder may
        be alive on another kernel. Only its lock's expiry frees the store then.
        """
        if self.host != here.host or not self.boot_id or self.boot_id != here.boot_id:
            return False
        if not self.pidns or self.pidns != here.pidns:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class LockRecord:
    """A lock object as found in the store."""

    key: str
    kind: LockKind
    holder: Holder
    purpose: str
    written: float
    """Unix time the store last wrote the lock (its last refresh), by the store's clock; minus
    infinity for a lock no live holder wrote."""

    def describe(self) -> str:
        """Short form for error messages."""
        h = self.holder
        return f"{self.kind.value} lock for {self.purpose} by {h.host} pid {h.pid}"

    def stale(self, store_now: float, settings: LockSettings, here: Holder) -> bool:
        """Whether others may ignore this lock: not refreshed for `stale_after_s` as the store's
        clock tells (`store_now`, see `_judged`), or its holder is certainly gone."""
        never_live = self.written == -math.inf
        return never_live or store_now - self.written > settings.stale_after_s or self.holder.dead(here)


def _encode(kind: LockKind, holder: Holder, purpose: str, refreshed: float) -> bytes:
    return json.dumps(
        {
            "kind": kind.value,
            "host": holder.host,
            "boot_id": holder.boot_id,
            "pidns": holder.pidns,
            "pid": holder.pid,
            "purpose": purpose,
            "refreshed": refreshed,
        }
    ).encode()


def read_locks(backend: Backend) -> Iterator[LockRecord]:
    """Every readable lock in the store; undecodable ones count as stale exclusive locks."""
    for key, written in backend.list_written(LOCK_PREFIX):
        try:
            doc = json.loads(backend.get(key))
            holder = Holder(str(doc["host"]), str(doc["boot_id"]), str(doc["pidns"]), int(doc["pid"]))
            yield LockRecord(key, LockKind(doc["kind"]), holder, str(doc["purpose"]), written)
        except ObjectMissing:
            continue  # Released between list and get.
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            # Our locks are written whole, so garbage here was not written by a live holder.
            yield LockRecord(key, LockKind.EXCLUSIVE, Holder("?", "", "", 0), "undecodable", -math.inf)


def _judged(backend: Backend, settings: LockSettings, here: Holder) -> list[tuple[LockRecord, bool]]:
    """Every lock in the store, each with whether it is stale. The store's time is read off the
    newest lock in the listing, which the caller makes after writing (or refreshing) its own:
    no earlier than that write, so no lock looks staler than it is. Ages are differences of the
    store's own times: hosts whose clocks disagree, by seconds or by hours, judge every lock
    alike, and a holder whose clock lags is not swept under."""
    locks = list(read_locks(backend))
    store_now = max((lock.written for lock in locks), default=-math.inf)
    return [(lock, lock.stale(store_now, settings, here)) for lock in locks]


def remove_stale(backend: Backend, settings: LockSettings) -> int:
    """Delete locks nobody may honour any more; returns how many. The caller holds a lock of
    its own (GC's, for its mark), which dates the listing (`_judged`)."""
    stale = [lock.key for lock, stale in _judged(backend, settings, Holder.current()) if stale]
    backend.delete(stale)
    return len(stale)


class StoreLock:
    """One held lock, refreshed in the background until released; use as a context manager."""

    def __init__(self, backend: Backend, settings: LockSettings, kind: LockKind, purpose: str) -> None:
        self._backend = backend
        self._settings = settings
        self._kind = kind
        self._purpose = purpose
        self._holder = Holder.current()
        self._key = f"{LOCK_PREFIX}{uuid.uuid4().hex}.json"
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._last_refresh = 0.0
        self._rng = random.Random()

    def _write(self) -> None:
        # Not durable: a lock means nothing once its holder is gone, and a crash of its host ends
        # the holder (other parties see it stale once it expires). A restore waited 1-2 ms for
        # the fsync, at its start.
        lock = _encode(self._kind, self._holder, self._purpose, time.time())
        self._backend.put(self._key, lock, durable=False)
        self._last_refresh = time.monotonic()

    def _conflicts(self) -> list[LockRecord]:
        found = []
        for lock, stale in _judged(self._backend, self._settings, self._holder):
            if lock.key == self._key or stale:
                continue
            if self._kind is LockKind.EXCLUSIVE or lock.kind is LockKind.EXCLUSIVE:
                found.append(lock)
        return found

    def acquire(self, timeout_s: float) -> StoreLock:
        """Take the lock, backing off while a conflicting one is held; StoreLocked after timeout_s."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            self._write()
            try:
                conflicts = self._conflicts()
            except BaseException:
                # A lock left behind would block GC until it went stale.
                with contextlib.suppress(SnapshotError):
                    self._backend.delete([self._key])
                raise
            if not conflicts:
                break
            self._backend.delete([self._key])
            if time.monotonic() + delay > deadline:
                raise StoreLocked(
                    f"could not take a {self._kind.value} store lock for {self._purpose} within {timeout_s:g} s",
                    tuple(c.describe() for c in conflicts),
                )
            # Jitter keeps two backing-off parties from colliding again in lockstep.
            time.sleep(delay * (0.5 + self._rng.random()))
            delay = min(delay * 2, 2.0)
        self._refresher = threading.Thread(
            target=self._refresh_loop, name=f"stasis-lock-{self._purpose}", daemon=True
        )
        self._refresher.start()
        return self

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self._settings.refresh_interval_s):
            with contextlib.suppress(SnapshotError):  # ensure_held() notices if refreshes keep failing.
                self._write()

    def ensure_held(self) -> None:
        """Raise StoreLocked unless the lock is certainly still honoured by every other node.

        Half of stale_after_s is the margin left for a refresh that took long to land (the
        store dates it when it arrives) and for the step that follows this check (publishing a
        manifest, one sweep batch).
        """
        age = time.monotonic() - self._last_refresh
        if age > self._settings.stale_after_s / 2:
            raise StoreLocked(
                f"{self._kind.value} store lock for {self._purpose} not refreshed for {age:.0f} s"
            )
        if self._backend.size(self._key) is None:
            raise StoreLocked(
                f"{self._kind.value} store lock for {self._purpose} was removed by another node"
            )

    def release(self, quiet: bool = False) -> None:
        """Stop refreshing and delete the lock object; quiet leaves a failed delete to go stale."""
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
        try:
            self._backend.delete([self._key])
        except SnapshotError:
            if not quiet:
                raise

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Do not let a failed delete mask the error that is already propagating.
        self.release(quiet=exc is not None)
