"""Sampling a turn upstream and relaying it to the harness, whole or streamed.

A whole response is recorded before its first byte goes to the harness. A streamed one flows as
it is generated and is recorded before its terminal event; the generation runs to its end and is
recorded even when the harness has gone away (frozen mid-stream), so that its retry is served
from the ledger. A stream the model server cuts is never a turn: nothing is recorded and the
harness is told.
"""

from __future__ import annotations

import json
import time

from aiohttp import web

from orchestrator.gateway.delivery import EVENT_STREAM, Delivery
from orchestrator.gateway.dialects import Dialect
from orchestrator.gateway.generation import Generation, UpstreamFault
from orchestrator.gateway.protocols import GatewayError, Protocol
from orchestrator.gateway.readers import TextReader, TokenReader, loads
from orchestrator.gateway.recording import Recorder
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.gateway.turn import Turn
from orchestrator.gateway.upstream import Stream, Upstream, UpstreamUnreachable


class Relay:
    """Samples turns from the model server and relays them to harnesses as they are recorded."""

    def __init__(
        self,
        upstream: Upstream,
        dialect: Dialect,
        renderer: ChatRenderer | None,
        delivery: Delivery,
        recorder: Recorder,
    ) -> None:
        self.upstream = upstream
        self.dialect = dialect
        self.renderer = renderer
        self.delivery = delivery
        self.recorder = recorder

    async def whole(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        req, protocol = turn.request, turn.protocol
        started = time.monotonic()
        path, root = self._route_of(turn)
        try:
            reply = await self.upstream.post(path, turn.body, root=root)
        except UpstreamUnreachable as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None
        upstream_ms = (time.monotonic() - started) * 1000
        if reply.status != 200:
            return await self._refused(turn, reply.status, reply.body)
        reader = self._reader(turn)
        try:
            reader.add(loads(reply.body))
            g = reader.finish()
        except UpstreamFault as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None
        g.policy_version = (
            g.policy_version or self.upstream.policy_version(reply.headers) or turn.published_version
        )
        _name_calls(protocol, g)
        delivered = protocol.render(g, reply.body, req)
        recorded = await self.recorder.record(turn, g, reply.body, delivered, upstream_ms, sending=True)
        return await self.delivery.recorded(
            request, recorded.id, delivered, False, turn.episode.runs, recorded.sending_at
        )

    async def stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        started = time.monotonic()
        path, root = self._route_of(turn)
        try:
            async with self.upstream.stream(path, turn.body, root=root) as upstream:
                if upstream.status != 200:
                    return await self._refused(turn, upstream.status, await upstream.body())
                return await self._events(request, turn, upstream, started)
        except UpstreamUnreachable as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None

    async def _events(
        self, request: web.Request, turn: Turn, upstream: Stream, started: float
    ) -> web.StreamResponse:
        protocol, req = turn.protocol, turn.request
        response = web.StreamResponse(status=200, headers=EVENT_STREAM)
        delivered = bytearray()
        gone = False

        async def send(data: bytes) -> None:
            nonlocal gone
            if data and not gone:
                # The harness froze or left: the generation still runs to its end.
                gone = not await self.delivery.send(request, response, data)

        gone = not await self.delivery.send(request, response, b"")
        encoder = protocol.encoder(req, tokens=turn.prompt is not None)
        reader = self._reader(turn)
        try:
            async for event, data in upstream.events():
                if reader.add(data):
                    out = encoder.chunk(event, data, reader.generation)
                    delivered += out
                    await send(out)
            if not upstream.done:
                raise UpstreamUnreachable("the model server's stream ended before [DONE]")
            g = reader.finish()
        except (UpstreamUnreachable, UpstreamFault) as exc:
            # A cut stream is never a turn: nothing is recorded, and the harness is told.
            await send(protocol.stream_error(GatewayError(502, str(exc), "upstream_error")))
            if not gone:
                await self.delivery.send(request, response, b"", eof=True)
            return response
        g.policy_version = (
            g.policy_version or self.upstream.policy_version(upstream.headers) or turn.published_version
        )
        _name_calls(protocol, g)
        tail = encoder.close(g)
        terminal = encoder.terminal(g)
        delivered += tail
        await send(tail)
        upstream_ms = (time.monotonic() - started) * 1000
        try:
            recorded = await self.recorder.record(
                turn, g, bytes(upstream.raw), bytes(delivered + terminal), upstream_ms, sending=not gone
            )
        except GatewayError as err:  # the episode ended meanwhile: no terminal event
            await send(protocol.stream_error(err))
            if not gone:
                await self.delivery.send(request, response, b"", eof=True)
            return response
        await send(terminal)
        if not gone:
            # The terminal event is out: delivered. A harness that hangs up once it has read it
            # may refuse the response's end, which changes nothing.
            await self.delivery.send(request, response, b"", eof=True)
            assert recorded.sending_at is not None
            await self.delivery.delivered(recorded.id, turn.episode.runs, recorded.sending_at)
        elif recorded.sending_run:
            await self.delivery.unsent(recorded.id)
        return response

    def _route_of(self, turn: Turn) -> tuple[str, bool]:
        """Where the turn is sent upstream: its path, and whether below the server's root."""
        if turn.prompt is not None:
            return self.dialect.path, self.dialect.root
        return turn.request.upstream_path, False

    def _reader(self, turn: Turn) -> TextReader | TokenReader:
        req = turn.request
        if turn.prompt is None or self.renderer is None:
            return TextReader(req.canonical.kind)
        up = req.upstream
        return TokenReader(req.canonical.kind, self.renderer, self.dialect, turn.prompt.ids, up.get("tools"),
                           str(up.get("model", "")))  # fmt: skip

    async def _refused(self, turn: Turn, status: int, body: bytes) -> web.Response:
        """The model server's own error: unchanged for its own protocols, translated otherwise.
        Nothing is recorded for the turn; a failure of the server's own (not a 4xx) is noted
        against the run."""
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500].decode(errors="replace")
        if not 400 <= status < 500:
            await self.recorder.outage(turn.episode, f"model server: {status} {message}")
        if turn.protocol.passthrough:
            return web.Response(status=status, body=body, content_type="application/json")
        kind = "invalid_request_error" if 400 <= status < 500 else "upstream_error"
        err = GatewayError(status if 400 <= status < 500 else 502, f"model server: {message}", kind)
        return web.Response(status=err.status, body=turn.protocol.error(err), content_type="application/json")


def _name_calls(protocol: Protocol, g: Generation) -> None:
    """Give the generation's tool calls the ids the harness's protocol expects."""
    if not protocol.passthrough or g.mode == "tokens":
        for i, call in enumerate(g.tool_calls):
            call.id = protocol.call_id(call.id, i, g)
