"""Group commit: concurrent callers' write work shares one transaction, and so one durable
commit, the costly part of a submit on either database (SQLite's fsync, PostgreSQL's WAL flush).

Whoever commits next takes everything queued by then, so callers that arrive while a commit is
being made durable share the following one. Each work is a savepoint of its own: one that raises
is undone alone and its caller gets the error. It runs in its caller's context, so events record
who asked. Every caller returns once the commit that holds its work is durable.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

C = TypeVar("C")
T = TypeVar("T")


@dataclass
class _Queued(Generic[T]):
    """One caller's share of a group commit."""

    work: Callable[[Any], T]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    result: T | None = None
    error: BaseException | None = None
    done: bool = False


class GroupCommit(Generic[C]):
    def __init__(self, tx: Callable[[], AbstractContextManager[C]], inside: Callable[[], bool]) -> None:
        self._tx = tx
        """A write transaction; inside one of this thread, a savepoint of it."""
        self._inside = inside
        """Whether this thread is inside a write transaction already."""
        self._queue: list[_Queued[Any]] = []
        self._queue_lock = threading.Lock()
        self._committing = threading.Lock()

    def run(self, work: Callable[[C], T]) -> T:
        """Run `work` in a write transaction that it may share with other callers' work, and
        return once that transaction has committed."""
        if self._inside():  # it commits with this thread's own transaction
            with self._tx() as db:
                return work(db)
        queued: _Queued[T] = _Queued(work)
        with self._queue_lock:
            self._queue.append(queued)
        with self._committing:
            if not queued.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit(batch)
        if queued.error is not None:
            raise queued.error
        return queued.result  # type: ignore[return-value]

    def _commit(self, batch: list[_Queued[Any]]) -> None:
        try:
            with self._tx() as db:
                for queued in batch:
                    try:
                        with self._tx():
                            queued.result = queued.context.run(queued.work, db)
                    except Exception as exc:  # handed to the caller it belongs to
                        queued.error = exc
        except BaseException as exc:
            for queued in batch:
                queued.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for queued in batch:
                queued.done = True
