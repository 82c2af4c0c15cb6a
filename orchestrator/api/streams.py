"""Long server streams (watches, trajectory feeds, exports, imports) each hold one of the gRPC
server's worker threads for as long as they run. They get at most MAX_STREAMS of API_WORKERS,
so short calls, node heartbeats among them, always find a free thread."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from orchestrator.domain import TemporaryError

API_WORKERS = 64
MAX_STREAMS = 48

F = TypeVar("F", bound=Callable[..., Iterator[Any]])


class StreamSlots:
    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot; when none is free, refuse (UNAVAILABLE) rather than wait."""
        if not self._free.acquire(blocking=False):
            raise TemporaryError(
                f"{self.limit} streams are open, as many as this orchestrator serves at once; "
                "try again shortly",
                delay=1,
            )
        try:
            yield
        finally:
            self._free.release()


def bounded(method: F) -> F:
    """A streaming method of a service with `streams: StreamSlots` that runs in a slot."""

    @functools.wraps(method)
    def stream(self: Any, *args: Any) -> Iterator[Any]:
        with self.streams.slot():
            yield from method(self, *args)

    return stream  # type: ignore[return-value]
