"""The gateway's HTTP routes: one per harness protocol, the model listing, Anthropic's
count_tokens, and a refusal naming the served routes for anything else.

Each request is authenticated before its body is read (`authentication`), its body is read
within the gateway's bounds and parsed by its protocol, and it is answered (`answering`). Every
refusal is an error in the request's own protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from orchestrator.gateway.answering import Answers
from orchestrator.gateway.authentication import Authentication
from orchestrator.gateway.commit import StatePool
from orchestrator.gateway.protocols import GatewayError, Protocol
from orchestrator.gateway.protocols.anthropic import Messages
from orchestrator.gateway.protocols.anthropic import to_messages as anthropic_messages
from orchestrator.gateway.protocols.anthropic import to_tools as anthropic_tools
from orchestrator.gateway.protocols.openai import ChatCompletions, Completions
from orchestrator.gateway.protocols.responses import Responses
from orchestrator.gateway.recording import Recorder
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.gateway.turn import Turn
from orchestrator.gateway.upstream import Upstream, UpstreamUnreachable

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOLS: dict[str, Protocol] = {
    "/v1/chat/completions": ChatCompletions(),
    "/v1/completions": Completions(),
    "/v1/responses": Responses(),
    "/v1/messages": Messages(),
}
INLINE_BODY_BYTES = 64 << 10
"""Request bodies up to this size are decoded on the event loop (it takes well under a
millisecond); longer ones on the gateway's pool (`Routes._body`)."""
_OPENAI = PROTOCOLS["/v1/chat/completions"]
_ANTHROPIC = PROTOCOLS["/v1/messages"]


class Routes:
    """The handlers of the gateway's HTTP application."""

    def __init__(
        self,
        settings: GatewaySettings,
        pool: StatePool,
        authentication: Authentication,
        answers: Answers,
        upstream: Upstream,
        recorder: Recorder,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.authentication = authentication
        self.answers = answers
        self.upstream = upstream
        self.recorder = recorder

    def add_to(self, app: web.Application) -> None:
        for path, protocol in PROTOCOLS.items():
            app.router.add_post(path, self._turn(protocol))
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)

    def _turn(self, protocol: Protocol) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                episode, resumed_at = await self.authentication.episode(request)
                raw, req = await self._body(request, protocol.parse)
            except GatewayError as err:
                return _refused(protocol, err)
            except RecursionError:  # JSON decodes deeper than canonical forms recurse
                return _refused(protocol, GatewayError(400, "request body nests too deep"))
            if req.dropped:
                log.debug("%s %s: left out %s", episode.id, protocol.name, ", ".join(req.dropped))
            try:
                return await self.answers.answer(request, Turn(episode, resumed_at, protocol, req, raw))
            except GatewayError as err:
                if err.kind == "upstream_error":  # the model server failed the run, not the harness
                    await self.recorder.outage(episode, str(err))
                return _refused(protocol, err)
            except Exception:
                log.exception("gateway failed on %s for %s", request.path, episode.id)
                return _refused(protocol, GatewayError(500, "internal gateway error", "server_error"))

        return handle

    async def _models(self, request: web.Request) -> web.Response:
        try:
            await self.authentication.episode(request)
            reply = await self.upstream.get("/models")
        except (GatewayError, UpstreamUnreachable) as exc:
            err = exc if isinstance(exc, GatewayError) else GatewayError(502, str(exc), "upstream_error")
            return _refused(_OPENAI, err)
        data = json.loads(reply.body) if reply.status == 200 else {"data": []}
        models = [
            {**m, "type": "model", "display_name": m.get("id"), "created_at": "1970-01-01T00:00:00Z"}
            for m in data.get("data") or []
        ]
        listing = {"object": "list", "data": models, "has_more": False,
                   "first_id": models[0]["id"] if models else None, "last_id": models[-1]["id"] if models else None}  # fmt: skip
        return web.json_response(listing)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's count_tokens, answered by the upstream's tokenizer; nothing is recorded."""
        try:
            await self.authentication.episode(request)
            _, chat = await self._body(request, _chat_to_count)
            count = await self.upstream.tokenize(chat)
        except GatewayError as err:
            return _refused(_ANTHROPIC, err)
        except UpstreamUnreachable as exc:
            return _refused(_ANTHROPIC, GatewayError(502, str(exc), "upstream_error"))
        if count is None:  # no tokenizer route upstream: about four characters a token
            count = len(json.dumps(chat)) // 4
        return web.json_response({"input_tokens": count})

    async def _unknown(self, request: web.Request) -> web.Response:
        protocol = _ANTHROPIC if request.path.startswith("/v1/messages") else _OPENAI
        routes = ", ".join(PROTOCOLS)
        return _refused(protocol, GatewayError(404, f"{request.method} {request.path} is not served; use {routes}",
                                               "not_found_error"))  # fmt: skip

    async def _body(self, request: web.Request, parse: Callable[[dict[str, Any]], T]) -> tuple[bytes, T]:
        """The request's body, and what `parse` makes of the JSON object it holds. A long one (a
        harness's whole conversation, megabytes of it) is decoded and parsed on the pool, so that
        it does not stall every other sandbox's stream on the event loop meanwhile."""
        raw = await self._read(request)
        if len(raw) <= INLINE_BODY_BYTES:
            return raw, _decoded(raw, parse)
        return raw, await self.pool.call(_decoded, raw, parse)

    async def _read(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise GatewayError(
                413, f"the body of {request.content_length} bytes exceeds {limit}", "request_too_large"
            )
        try:
            return await asyncio.wait_for(request.read(), self.settings.harness_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            raise GatewayError(413, f"the body exceeds {limit} bytes", "request_too_large") from None
        except TimeoutError:
            raise GatewayError(
                408, f"the body did not arrive within {self.settings.harness_timeout_s:g} s", "timeout_error"
            ) from None


def _refused(protocol: Protocol, err: GatewayError) -> web.Response:
    return web.Response(status=err.status, body=protocol.error(err), content_type="application/json")


def _decoded(raw: bytes, parse: Callable[[dict[str, Any]], T]) -> T:
    """`parse` of the JSON object `raw` holds; GatewayError (400) if it holds none."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, f"request body is not JSON: {exc}") from None
    except RecursionError:
        raise GatewayError(400, "request body nests too deep") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return parse(body)


def _chat_to_count(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic count_tokens body as the chat whose prompt the upstream counts."""
    tools, _ = anthropic_tools(body.get("tools"))
    return {"model": body.get("model", ""), "messages": anthropic_messages(body), "tools": tools}
