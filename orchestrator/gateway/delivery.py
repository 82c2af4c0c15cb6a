"""Sending an answer to the harness, and noting durably how far it got.

A delivery is noted as under way before its last part goes out (`Ledger.sending`), and as
delivered to its run only once it is out (`Ledger.delivered`); a harness that went away meanwhile
leaves the turn unsent, so its retry is a replay. A harness that takes no part of an answer for
`harness_timeout_s` has its connection cut, so that it never reads half an event.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from orchestrator.gateway.commit import GroupCommit
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.trajectory.ledger import Ledger

log = logging.getLogger(__name__)

EVENT_STREAM = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Delivery:
    """Sends recorded answers to harnesses and notes their delivery in the ledger."""

    def __init__(self, settings: GatewaySettings, ledger: Ledger, commit: GroupCommit) -> None:
        self.settings = settings
        self.ledger = ledger
        self.commit = commit

    async def recorded(
        self,
        request: web.Request,
        turn_id: int,
        data: bytes,
        stream: bool,
        run: int,
        sending_at: float | None = None,
        *,
        replay: bool = False,
    ) -> web.StreamResponse:
        """Send a recorded answer whole. The delivery is noted durably as under way before it
        goes out (`sending_at`: a fresh turn's record did so already, then), and as delivered to
        `run` only once it is out."""
        headers = EVENT_STREAM if stream else {"Content-Type": "application/json"}
        response = web.StreamResponse(status=200, headers=headers)
        response.content_length = len(data)
        at = time.time() if sending_at is None else sending_at
        if sending_at is None:
            await self.commit.run(lambda: self.ledger.sending(turn_id, run, at))
        if not await self.send(request, response, data, eof=True):
            log.info("a harness went away before turn %d was delivered; its retry is a replay", turn_id)
            await self.unsent(turn_id)
            return response
        await self.delivered(turn_id, run, at, replay)
        return response

    async def send(
        self, request: web.Request, response: web.StreamResponse, data: bytes, eof: bool = False
    ) -> bool:
        """Send `data` (the headers first, if not yet sent); False if the harness went away, or
        took no part of it for `harness_timeout_s` (then its connection is cut, so that it never
        reads half an event)."""

        async def send() -> None:
            if not response.prepared:
                await response.prepare(request)
            await response.write(data)
            if eof:
                await response.write_eof()

        try:
            await asyncio.wait_for(send(), self.settings.harness_timeout_s)
        except (ConnectionError, RuntimeError):
            return False
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            return False
        return True

    async def delivered(self, turn_id: int, run: int, at: float, replay: bool = False) -> None:
        """Note, durably, that a delivery to `run` whose last part went out at `at` reached its
        end. `at` is taken before that part left: the harness may have had it from then, so a
        snapshot that froze the sandbox later holds the turn. An identical request that waits for
        this one's lock then finds the turn answered."""
        await self.commit.run(lambda: self.ledger.delivered(turn_id, at, run, replay=replay))

    async def unsent(self, turn_id: int) -> None:
        """Note that the turn's delivery did not reach its end: its retry is a replay."""
        await self.commit.run(lambda: self.ledger.unsent(turn_id))
