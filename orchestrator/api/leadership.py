"""Leading or standing by: the thread that takes the leadership lease (`state.lease`), starts
the leader's parts once it has it, and gives up when it lapses.

A standby retries the lease every `poll_s`; a leader checks it as often. A lapsed lease is not
taken back: `lost` is called once, and the process is expected to end (`stasis server` exits,
so its supervisor restarts it as a standby), because work its control loop had in flight was cut
off by the fence mid-way and only a fresh start settles it cleanly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from orchestrator.domain import StasisError
from orchestrator.state import Lease

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often a standby asks for the lease and a leader checks it still holds it."""


class Leadership:
    def __init__(
        self, lease: Lease, lead: Callable[[], None], lost: Callable[[], None], poll_s: float = POLL_S
    ) -> None:
        self.lease = lease
        self._lead = lead
        self._lost = lost
        self.poll_s = poll_s
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)

    def start(self) -> Leadership:
        """Lead at once if the lease is free (what leading starts may raise here); otherwise
        stand by and keep asking."""
        if self._acquired():
            self._become_leader()
        else:
            log.info("standing by: %s leads", self.lease.leader())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.lease.release()

    def _acquired(self) -> bool:
        try:
            return self.lease.try_acquire()
        except StasisError as exc:
            log.warning("cannot ask for the leadership lease: %s", exc)
            return False

    def _become_leader(self) -> None:
        self.leading.set()
        log.info("leading: this orchestrator holds the lease")
        self._lead()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self.leading.is_set():
                if not self._acquired():
                    continue
                try:
                    self._become_leader()
                    continue
                except Exception:
                    log.exception("could not start leading")
            elif self.lease.held():
                continue
            else:
                log.error("the leadership lease lapsed: this orchestrator stops leading")
            self.leading.clear()
            self._lost()
            return
