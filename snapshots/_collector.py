"""Holding off Python's cyclic garbage collector while latency matters.

A collection of the oldest generation walks every object of the process. In a node agent that
holds a few decoded manifests (tens of thousands of tuples each) one takes 30-60 ms, and it runs
in whichever thread happens to allocate: a restore that decodes a manifest and parses CRIU's
pagemaps allocates enough to set one off now and then, and the younger generations' collections
cost it a few milliseconds more each time. Code on such a path runs under `collector_paused()`;
reference counting still frees what it drops, and the collector resumes when the last pause in
the process ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_resume = False
"""Whether the collector was on when the first of the current pauses began."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic collection in the process until every pause, from any thread, ends."""
    global _pauses, _resume
    with _lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


def set_aside_startup_objects() -> None:
    """Take every object the process holds now out of the collector's sight for good (`gc.freeze`),
    once it has started and before it serves: what a process starts with lives as long as it
    does. Reference counting still frees any of them that is dropped; only a cycle among them
    would outlive its use, which code loaded at start does not make."""
    gc.collect()
    gc.freeze()
