"""Generation slots shared fairly between episodes.

The gateway runs at most `total` generations upstream at once, and at most `per_episode` of
any one episode's. Requests that must wait queue per episode, and a freed slot goes to the
waiting episode that holds the fewest (the one waiting longest among those), so a harness that
sends many requests at once waits behind itself, never in front of a neighbour: when every slot
is taken, a neighbour's request gets the next one that comes free, whatever the greedy harness
has queued. A request that waits longer than its timeout is refused.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SlotTimeout(Exception):
    """No slot came free within the wait allowed."""


class FairSlots:
    """`total` slots, at most `per_episode` held by one episode, handed out in turn."""

    def __init__(self, total: int, per_episode: int) -> None:
        self.total = total
        self.per_episode = per_episode
        self._held: dict[str, int] = {}
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        """Episodes with requests waiting, in the order they are next served."""

    @property
    def busy(self) -> int:
        return sum(self._held.values())

    def held(self, episode: str) -> int:
        return self._held.get(episode, 0)

    @asynccontextmanager
    async def hold(self, episode: str, timeout: float) -> AsyncIterator[None]:
        """Hold a slot for the episode while inside; SlotTimeout if none comes within `timeout`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(episode, deque()).append(waiter)
        self._grant()
        if not waiter.done():
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except TimeoutError:
                if not waiter.done():
                    self._forget(episode, waiter)
                    waiter.cancel()
                    raise SlotTimeout(f"no generation slot came free within {timeout:g} s") from None
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release(episode)  # granted, but its request went away
                else:
                    self._forget(episode, waiter)
                raise
        try:
            yield
        finally:
            self._release(episode)

    def _take(self, episode: str) -> None:
        self._held[episode] = self.held(episode) + 1

    def _release(self, episode: str) -> None:
        left = self.held(episode) - 1
        if left:
            self._held[episode] = left
        else:
            self._held.pop(episode, None)
        self._grant()

    def _forget(self, episode: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(episode)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[episode]

    def _grant(self) -> None:
        """Hand free slots to waiting episodes, the one holding fewest first; one served moves
        behind the others."""
        while self.busy < self.total:
            eligible = [e for e in self._waiting if self.held(e) < self.per_episode]
            if not eligible:
                return
            episode = min(eligible, key=self.held)  # min keeps the first of equals: the longest waiting
            queue = self._waiting[episode]
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(episode)
            else:
                del self._waiting[episode]
            self._take(episode)
            waiter.set_result(None)
