"""Operations in flight: at most one per episode, each on a worker thread, so a slow agent call
never holds up the control loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from orchestrator.domain import Episode, FailedPrecondition
from orchestrator.state import StateStore

log = logging.getLogger(__name__)


class Work:
    """Claims episodes for operations and runs them on a bounded pool of workers."""

    def __init__(self, store: StateStore, workers: int, wake: Callable[[], None]) -> None:
        self.store = store
        self._wake = wake
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="control")

    def busy(self) -> frozenset[str]:
        """Episodes with an operation in flight."""
        with self._lock:
            return frozenset(self._busy)

    @contextmanager
    def claim(self, episode_id: str) -> Iterator[None]:
        """Hold the episode for an operation; a second claim is refused, not queued. The claim
        lasts past the block only if the block handed it to a worker with `submit`."""
        with self._lock:
            if episode_id in self._busy:
                raise FailedPrecondition(
                    f"episode {episode_id} has an operation in progress; try again shortly"
                )
            self._busy.add(episode_id)
        try:
            yield
        except BaseException:
            self._release(episode_id)
            raise

    def _release(self, episode_id: str) -> None:
        with self._lock:
            self._busy.discard(episode_id)
        self._wake()

    def submit(self, episode_id: str, operation: Callable[..., None], *args: Any) -> None:
        """Run operation(episode, *args) on a worker for a claimed episode, then release it."""
        self._pool.submit(self._guarded, episode_id, operation, *args)

    def begin(self, e: Episode, operation: Callable[..., None], *args: Any) -> None:
        """Claim and run in one step; an episode that is busy, or a pool shutting down, is
        left for the next tick."""
        try:
            with self.claim(e.id):
                self.submit(e.id, operation, *args)
        except (FailedPrecondition, RuntimeError):
            return

    def background(self, task: Callable[..., object], *args: Any) -> None:
        """Run a task that claims no episode (deleting a stale sandbox, retention)."""
        try:
            self._pool.submit(task, *args)
        except RuntimeError:  # shutting down
            log.info("not starting %s: the control loop is stopping", getattr(task, "__name__", task))

    def _guarded(self, episode_id: str, operation: Callable[..., None], *args: Any) -> None:
        try:
            operation(self.store.episodes.get(episode_id), *args)
        except Exception:
            log.exception("operation %s on episode %s failed", operation.__name__, episode_id)
        finally:
            self._release(episode_id)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
