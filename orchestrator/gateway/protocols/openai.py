"""OpenAI Chat Completions and Completions: the upstream's own protocols, passed through.

The harness's body goes upstream as it came, with token ids and log-probs asked for; the
upstream's bytes (or its server-sent events) go back unchanged. Only the terminal `[DONE]` is
held until the turn is recorded.
"""

from __future__ import annotations

from typing import Any

from orchestrator.gateway.canonical import CanonicalRequest
from orchestrator.gateway.generation import Generation
from orchestrator.gateway.protocols import GatewayError, Protocol, Request, StreamEncoder

DONE = b"data: [DONE]\n\n"


class _Passthrough(StreamEncoder):
    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        return event

    def close(self, g: Generation) -> bytes:
        return b""

    def terminal(self, g: Generation) -> bytes:
        return DONE


class ChatCompletions(Protocol):
    name = "chat"
    passthrough = True
    kind = "chat"
    path = "/chat/completions"

    def parse(self, body: dict[str, Any]) -> Request:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise GatewayError(400, "stream: must be a boolean")
        if body.get("n", 1) != 1:
            raise GatewayError(400, "n: the Stasis gateway samples one choice per request")
        upstream = dict(body)
        if self.kind == "chat":
            upstream["logprobs"] = True
        elif not isinstance(upstream.get("logprobs"), int) or upstream["logprobs"] < 1:
            upstream["logprobs"] = 1
        try:
            canonical = CanonicalRequest.parse(self.kind, body, protocol=self.name, stream=stream)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None
        return Request(self.path, upstream, canonical, stream)

    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        return raw

    def encoder(self, request: Request) -> StreamEncoder:
        return _Passthrough()


class Completions(ChatCompletions):
    name = "completion"
    kind = "completion"
    path = "/completions"
