"""The chunk threads: one small pool that puts, fetches, verifies and a lazy restore's read-ahead
share, each long job taking turns with whatever else waits for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

BATCH_BYTES = 1 << 20
"""Chunks go to the threads a megabyte at a time: a task per 64 KiB chunk spends more on handing
work between threads than a 2-core node can spare."""


class ChunkThreads:
    """A few threads doing hashing, zstd and I/O for one chunk store."""

    def __init__(self, count: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="stasis-chunks")
        self._count = count

    def close(self) -> None:
        """Stop the threads once their work is done."""
        self._pool.shutdown(wait=True)

    def submit(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """fn(*args) on a thread, behind what already waits (read-ahead)."""
        return self._pool.submit(fn, *args, **kwargs)

    def shared(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items on the pool's threads, results in input order.

        A thread takes the next item as it finishes one, so no thread waits on another's item
        and the caller hands nothing over per item; items are drawn (and so produced) only as
        threads come free. After each item a thread queues its next turn behind whatever else
        waits for the pool (a lazy restore's read-ahead, another put), so that a long put or
        fetch never holds the threads from it. The first failure stops the rest and is raised
        once every turn has ended, so no task still touches what the caller drops next."""
        source = enumerate(items)
        results: dict[int, R] = {}
        lock = threading.Lock()
        failed: list[BaseException] = []
        turns = self._count
        ended = threading.Event()

        def stop(exc: BaseException | None) -> None:
            """End one turn for good (under the lock)."""
            nonlocal turns
            if exc is not None:
                failed.append(exc)
            turns -= 1
            if turns == 0:
                ended.set()

        def queue() -> None:
            try:
                self._pool.submit(turn)  # noqa: F821 (deleted once every turn has ended)
            except RuntimeError as exc:  # the pool is shut down
                with lock:
                    stop(exc)

        def turn() -> None:
            with lock:
                try:
                    taken = None if failed else next(source, None)
                except BaseException as exc:  # the producer failed
                    stop(exc)
                    return
                if taken is None:
                    stop(None)
                    return
            index, item = taken
            try:
                result = fn(item)
            except BaseException as exc:
                with lock:
                    stop(exc)
                return
            with lock:
                results[index] = result
            queue()  # noqa: F821 (as above)

        for _ in range(self._count):
            queue()
        try:
            ended.wait()
        except BaseException as exc:  # interrupted: stop the threads before the caller cleans up
            with lock:
                failed.append(exc)
            ended.wait()
            raise
        finally:
            # Every turn has ended. `turn` and `queue` refer to each other: a cycle that would
            # hold fn, the items and the results until the next cyclic collection.
            del turn, queue
        if failed:
            raise failed[0]
        return [results[index] for index in range(len(results))]
