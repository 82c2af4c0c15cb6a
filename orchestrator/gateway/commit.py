"""How the gateway reaches its ledger and state from its event loop.

Ledger writes are gathered over one turn of the loop and committed together (`GroupCommit`);
blocking reads of the state run on a small thread pool (`StatePool`); identical requests of one
episode take turns under one lock (`KeyLocks`), so the replay check and the claim on a new
sample are one step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from orchestrator.trajectory.ledger import Ledger

T = TypeVar("T")


class GroupCommit:
    """Ledger calls made on the event loop, gathered over one turn of the loop and committed in
    one transaction: one fsync for every turn that finished meanwhile, and no thread between the
    gateway and its ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._scheduled = False

    def run(self, op: Callable[[], T]) -> asyncio.Future[T]:
        """Commit op with the next batch, at the end of this turn of the loop; the future is done
        once the batch is durable."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        try:
            results = self.ledger.batch([op for op, _ in batch])
        except Exception as exc:  # the commit itself failed: nothing of the batch is recorded
            results = [(False, exc)] * len(batch)
        for (_, future), (ok, value) in zip(batch, results, strict=True):
            if not future.cancelled():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)


class StatePool:
    """A few threads for the calls that block (state reads, long bodies, rendering), so that they
    do not stall every other sandbox's stream on the event loop."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-state")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class KeyLocks:
    """One lock per (episode, request fingerprint), alive while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: tuple[str, str]) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]
