"""Server-streaming RPCs over blocking work: run the work on a thread, yield what it reports as
it reports it, then hand back what it returns. Both services stream image pulls this way."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_END = object()


def relay(work: Callable[[Callable[[T], None]], R], name: str = "relay") -> Generator[T, None, R]:
    """`result = yield from relay(lambda report: ...)`: yields each `report(item)` in order, then
    returns the work's result or raises its exception. A client that goes away stops the
    relaying, not the work: a pull it started still lands in the cache."""
    items: queue.Queue[object] = queue.Queue()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = work(items.put)
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc
        finally:
            items.put(_END)

    threading.Thread(target=run, name=name, daemon=True).start()
    while (item := items.get()) is not _END:
        yield item  # type: ignore[misc]
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
