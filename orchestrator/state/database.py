"""One SQLite connection as the control plane uses it: WAL, fsync on every commit, one writer."""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from orchestrator.state.grouping import GroupCommit

T = TypeVar("T")

READERS = 4
"""Read connections per database: enough for the API threads and the control loop to read while
a commit syncs, few enough that SQLite's per-connection memory stays small."""


class Database:
    def __init__(self, path: Path, schema: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = self._connect()
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit that returned is on disk, so a SIGKILL or power cut loses nothing committed.
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(schema)
        self.lock = threading.RLock()
        self._depth = 0
        self._writer = 0
        """The thread inside a write transaction, if any."""
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._all_readers = [self._connect(query_only=True) for _ in range(READERS)]
        for reader in self._all_readers:
            self._readers.put(reader)
        self._group = GroupCommit(self.tx, lambda: self._writer == threading.get_ident())
        self._changed = threading.Condition(self.lock)
        """Notified on every commit of this connection and when the database closes."""
        self.closed = False

    def _connect(self, *, query_only: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        db.row_factory = sqlite3.Row
        if query_only:
            db.execute("PRAGMA query_only=ON")
        return db

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.db.close()
            for reader in self._all_readers:
                reader.close()
            self._changed.notify_all()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads, which see every committed transaction. Readers do not wait
        for a writer's fsync (WAL), and a few of them run at once. Inside this thread's own
        write transaction it is that transaction's connection, so the reads see its writes."""
        if self._writer == threading.get_ident():
            with self.lock:
                yield self.db
            return
        reader = self._readers.get()
        try:
            yield reader
        finally:
            self._readers.put(reader)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once so concurrent writers queue instead of failing.

        Inside another transaction of this connection it is a savepoint: its work commits with
        the outer one, and a failure undoes only its own part.
        """
        with self.lock:
            if self._depth:
                savepoint = f"sp{self._depth}"
                self.db.execute(f"SAVEPOINT {savepoint}")
                self._depth += 1
                try:
                    yield self.db
                except BaseException:
                    self.db.execute(f"ROLLBACK TO {savepoint}")
                    raise
                finally:
                    self._depth -= 1
                    self.db.execute(f"RELEASE {savepoint}")
                return
            self.db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            self._writer = threading.get_ident()
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0
                self._writer = 0
            self.db.execute("COMMIT")
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate` holds, the database closes, or `timeout` passes; `predicate`
        is asked again after every commit of this connection."""
        with self._changed:
            return self._changed.wait_for(lambda: self.closed or predicate(), timeout=timeout)

    def grouped(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` in a write transaction that it may share with other callers' work: one
        commit, and so one fsync, for all of them (`grouping.GroupCommit`)."""
        return self._group.run(work)
