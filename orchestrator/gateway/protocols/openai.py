"""OpenAI Chat Completions and Completions: the upstream's own protocols.

In text mode they are passed through: the harness's body goes upstream as it came, with token
ids and log-probs asked for, and the upstream's bytes (or its server-sent events) go back
unchanged; only the terminal `[DONE]` is held until the turn is recorded. In token mode the
upstream is sent token ids, and the answer is written here in the protocol's shape from what the
model's parser read from the sampled ids: content, `reasoning_content`, tool calls with their
arguments as the model wrote them, and, where the harness asked, per-token log-probs and ids.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.gateway.generation import Generation
from orchestrator.gateway.protocols import GatewayError, Protocol, Request, StreamEncoder, sse
from orchestrator.trajectory.canonical import CanonicalRequest

DONE = b"data: [DONE]\n\n"
ASKED = ("logprobs", "top_logprobs", "return_token_ids", "stream_options")
"""What a harness asked of the answer's shape, kept to write it in token mode."""


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
        return Request(self.path, upstream, canonical, stream, echo={k: body.get(k) for k in ASKED})

    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        if g.mode == "text":
            return raw
        choice: dict[str, Any] = {"index": 0, "message": g.message(), "logprobs": _chat_logprobs(g, request),
                                  "finish_reason": g.finish_reason}  # fmt: skip
        return json.dumps(_answer(g, request, "chat.completion", choice)).encode()

    def encoder(self, request: Request, tokens: bool = False) -> StreamEncoder:
        return _ChatEvents(request) if tokens else _Passthrough()


class Completions(ChatCompletions):
    name = "completion"
    kind = "completion"
    path = "/completions"

    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        if g.mode == "text":
            return raw
        logprobs = None
        if request.echo.get("logprobs") is not None:
            logprobs = {"tokens": g.token_texts, "token_logprobs": g.logprobs, "top_logprobs": None,
                        "text_offset": _offsets(g.token_texts)}  # fmt: skip
        choice = {"index": 0, "text": g.text, "logprobs": logprobs, "finish_reason": g.finish_reason}
        return json.dumps(_answer(g, request, "text_completion", choice)).encode()

    def encoder(self, request: Request, tokens: bool = False) -> StreamEncoder:
        return _CompletionEvents(request) if tokens else _Passthrough()


def _answer(g: Generation, request: Request, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
    """A whole answer in token mode: the choice, the usage and, if asked, the token ids."""
    if request.echo.get("return_token_ids"):
        choice["token_ids"] = g.token_ids
        choice["prompt_token_ids"] = g.prompt_token_ids
    return {"id": g.response_id, "object": kind, "created": g.created, "model": g.model,
            "system_fingerprint": g.policy_version or None, "choices": [choice], "usage": _usage(g)}  # fmt: skip


def _usage(g: Generation) -> dict[str, int]:
    return {"prompt_tokens": g.input_tokens, "completion_tokens": g.output_tokens,
            "total_tokens": g.input_tokens + g.output_tokens}  # fmt: skip


def _chat_logprobs(g: Generation, request: Request) -> dict[str, Any] | None:
    """Every sampled token's log-prob, if the harness asked (alternatives are not kept)."""
    if not request.echo.get("logprobs"):
        return None
    entries = [{"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
               for text, lp in zip(g.token_texts, g.logprobs, strict=True)]  # fmt: skip
    return {"content": entries, "refusal": None}


def _offsets(texts: list[str]) -> list[int]:
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return offsets


class _Deltas(StreamEncoder):
    """A token-mode stream: chunks of what text and reasoning grew by, then what only the end
    tells (tool calls, the finish reason, the usage if asked), then `[DONE]`."""

    kind = ""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.sent = {"text": 0, "reasoning": 0}
        self.started = False

    def _chunk(self, g: Generation, choice: dict[str, Any]) -> bytes:
        return sse(None, {"id": g.response_id, "object": self.kind, "created": g.created, "model": g.model,
                          "choices": [{"index": 0, **choice}]})  # fmt: skip

    def _grown(self, g: Generation, name: str) -> str:
        value: str = getattr(g, name)
        grown, self.sent[name] = value[self.sent[name] :], len(value)
        return grown

    def close(self, g: Generation) -> bytes:
        out = self.chunk(b"", {}, g)
        out += self._end(g)
        out += self._chunk(g, {**self._empty(), "finish_reason": g.finish_reason})
        options = self.request.echo.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            out += sse(None, {"id": g.response_id, "object": self.kind, "created": g.created, "model": g.model,
                              "choices": [], "usage": _usage(g)})  # fmt: skip
        return out

    def _end(self, g: Generation) -> bytes:
        return b""

    def _empty(self) -> dict[str, Any]:
        return {}

    def terminal(self, g: Generation) -> bytes:
        return DONE


class _ChatEvents(_Deltas):
    kind = "chat.completion.chunk"

    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        out = b""
        if not self.started:
            self.started = True
            out += self._chunk(
                g, {"delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            )
        for name, field in (("reasoning", "reasoning_content"), ("text", "content")):
            grown = self._grown(g, name)
            if grown:
                out += self._chunk(g, {"delta": {field: grown}, "logprobs": None, "finish_reason": None})
        return out

    def _end(self, g: Generation) -> bytes:
        if not g.tool_calls:
            return b""
        calls = [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for i, c in enumerate(g.tool_calls)]  # fmt: skip
        return self._chunk(g, {"delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None})

    def _empty(self) -> dict[str, Any]:
        return {"delta": {}, "logprobs": None}


class _CompletionEvents(_Deltas):
    kind = "text_completion"

    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        grown = self._grown(g, "text")
        return self._chunk(g, {"text": grown, "logprobs": None, "finish_reason": None}) if grown else b""

    def _empty(self) -> dict[str, Any]:
        return {"text": "", "logprobs": None}
