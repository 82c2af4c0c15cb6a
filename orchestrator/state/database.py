"""One SQLite connection as the control plane uses it: WAL, fsync on every commit, one writer."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class Database:
    def __init__(self, path: Path, schema: str, on_commit: Callable[[], None] = lambda: None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit that returned is on disk, so a SIGKILL or power cut loses nothing committed.
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(schema)
        self.lock = threading.RLock()
        self._depth = 0
        self._on_commit = on_commit
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.db.close()

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
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0
            self.db.execute("COMMIT")
            self._on_commit()
