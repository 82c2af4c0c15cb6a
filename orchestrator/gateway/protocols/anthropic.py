"""Anthropic Messages (`POST /v1/messages`, what Claude Code speaks), translated onto chat
completions.

The system prompt becomes a system message; text and image blocks become content parts;
`tool_use` blocks the assistant's tool calls and `tool_result` blocks tool results; `thinking`
blocks the assistant message's reasoning (`redacted_thinking` ones, opaque, are left out). Tools
keep their `input_schema` as the function's parameters. A deferred tool (`defer_loading`) is not
listed up front: its definition comes in where a tool result references it (`tool_reference`),
so the tool listing, and with it every prompt's beginning, stays the same as tools load. Tool
call ids are shown as `toolu_…`.

The model's reasoning comes back as a `thinking` block (streamed as `thinking_delta`s) before the
text, with a signature that is a digest of it: nothing here is secret, and a harness sends the
block back as it got it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

from orchestrator.gateway.generation import Generation
from orchestrator.gateway.protocols import (
    GatewayError,
    Protocol,
    Request,
    StreamEncoder,
    listed,
    mapped,
    pick,
    require,
    sse,
)
from orchestrator.trajectory.canonical import CanonicalRequest

DROPPED = (
    "thinking", "context_management", "output_config", "metadata", "service_tier", "container",
    "mcp_servers", "betas", "anthropic_beta", "anthropic_version",
)  # fmt: skip
"""Messages fields with no meaning for an open-weights upstream; see docs/harnesses.md."""
KNOWN = {
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
    "tools", "tool_choice", "stream", *DROPPED,
}  # fmt: skip
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "function_call": "tool_use"}
_ERRORS = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit_error": "rate_limit_error",
    "overloaded_error": "overloaded_error",
    "upstream_error": "api_error",
    "server_error": "api_error",
}


def _text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    if isinstance(blocks, list):
        return "".join(
            str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = mapped(block.get("source"), f"{where}.source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        raise GatewayError(400, f"{where}.source: image source type {source.get('type')!r} is not supported")
    return {"type": "image_url", "image_url": {"url": url}}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": str(tool["name"]),
        "description": str(tool.get("description") or ""),
        "parameters": tool["input_schema"],
    }


def deferred_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """The tools a harness defers (`defer_loading`): not in the model's context up front, each
    coming in as its definition where a tool result references it."""
    return {
        str(t["name"]): {"type": "function", "function": _function(t)}
        for t in listed(tools, "tools")
        if isinstance(t, dict) and t.get("defer_loading") and t.get("name") and "input_schema" in t
    }


def _result(content: Any, deferred: dict[str, dict[str, Any]]) -> str:
    """A tool result's text; a `tool_reference` (a deferred tool loaded) is the tool's
    definition, as the tool listing would give it."""
    if not isinstance(content, list):
        return _text(content)
    out = []
    for b in content:
        if isinstance(b, dict) and b.get("type") == "tool_reference":
            name = str(b.get("tool_name", ""))
            out.append(json.dumps(deferred[name], ensure_ascii=False) if name in deferred else f"tool {name}")
        else:
            out.append(_text([b]))
    return "\n".join(x for x in out if x)


def to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        if not isinstance(system, str | list):
            raise GatewayError(400, "system: must be a string or a list of text blocks")
        messages.append({"role": "system", "content": _text(system)})
    items = require(body, "messages", list, "a non-empty list of messages")
    deferred = deferred_tools(body.get("tools"))
    if not items:
        raise GatewayError(400, "messages: must be a non-empty list of messages")
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise GatewayError(400, f"{where}.role: must be user, assistant or system")
        content = m.get("content")
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise GatewayError(400, f"{where}.content: must be a string or a list of content blocks")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind == "image":
                parts.append(_image(block, at))
            elif kind == "tool_use":
                # As a chat template writes JSON (no ASCII escapes, spaced), the likeliest match
                # of what the model wrote; in token mode the sampled tokens are sent instead.
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")), "arguments": arguments}})  # fmt: skip
            elif kind == "tool_result":
                result = _result(block.get("content"), deferred)
                if block.get("is_error"):
                    result = f"[error] {result}"
                messages.append(
                    {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result}
                )
            elif kind == "thinking":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "redacted_thinking":
                continue
            else:
                raise GatewayError(400, f"{at}.type: content block type {kind!r} is not supported")
        if parts or calls or reasoning:
            message: dict[str, Any] = {"role": m["role"], "content": parts or None}
            if calls:
                message["tool_calls"] = calls
            if reasoning and m["role"] == "assistant":
                message["reasoning_content"] = "".join(reasoning)
            messages.append(message)
    return messages


def to_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    out, dropped = [], []
    for i, tool in enumerate(listed(tools, "tools")):
        if not isinstance(tool, dict):
            raise GatewayError(400, f"tools[{i}]: must be an object")
        if "input_schema" not in tool:
            dropped.append(f"tools[{i}] ({tool.get('type', 'server tool')})")
            continue
        if not tool.get("name"):
            raise GatewayError(400, f"tools[{i}].name: is required")
        if tool.get("defer_loading"):
            dropped.append(f"tools[{i}] ({tool['name']}: deferred until a tool result references it)")
            continue
        out.append({"type": "function", "function": _function(tool)})
    return out, dropped


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise GatewayError(400, "tool_choice: must be {type: auto|any|none} or {type: tool, name}")


class Messages(Protocol):
    name = "messages"

    def parse(self, body: dict[str, Any]) -> Request:
        require(body, "model", str, "a model name")
        require(body, "max_tokens", int, "a whole number of tokens")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise GatewayError(400, "stream: must be a boolean")
        tools, dropped = to_tools(body.get("tools"))
        upstream: dict[str, Any] = {
            "model": body["model"],
            "messages": to_messages(body),
            **pick(body, {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                          "top_k": "top_k", "stop_sequences": "stop"}),
        }  # fmt: skip
        if tools:
            upstream["tools"] = tools
            choice = _tool_choice(body.get("tool_choice"))
            if choice is not None:
                upstream["tool_choice"] = choice
        dropped += [k for k in body if k in DROPPED or k not in KNOWN]
        canonical = CanonicalRequest.parse("chat", upstream, protocol=self.name, stream=stream)
        return Request("/chat/completions", upstream, canonical, stream, tuple(dropped))

    def call_id(self, upstream_id: str, index: int, g: Generation) -> str:
        return "toolu_" + (upstream_id.removeprefix("call_") or f"{g.response_id[-12:]}{index}")

    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        return json.dumps(_message(g, request, _id(), done=True)).encode()

    def encoder(self, request: Request, tokens: bool = False) -> StreamEncoder:
        return _Events(request)

    def error(self, err: GatewayError) -> bytes:
        kind = _ERRORS.get(err.kind, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": str(err)}}).encode()

    def stream_error(self, err: GatewayError) -> bytes:
        return b"event: error\ndata: " + self.error(err) + b"\n\n"


def _id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def signature(thinking: str) -> str:
    """The signature of a thinking block: a digest of its text (there is nothing to keep secret)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def _content(g: Generation) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if g.reasoning:
        blocks.append({"type": "thinking", "thinking": g.reasoning, "signature": signature(g.reasoning)})
    if g.text or not g.tool_calls:
        blocks.append({"type": "text", "text": g.text})
    for call in g.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.parsed_arguments()}
        )
    return blocks


def _message(g: Generation, request: Request, message_id: str, *, done: bool) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": g.model or str(request.upstream["model"]),
        "content": _content(g) if done else [],
        "stop_reason": _STOP.get(g.finish_reason, "end_turn") if done else None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": g.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": g.output_tokens if done else 1,
        },
    }


class _Events(StreamEncoder):
    """message_start; per content block (thinking, text, tool uses): start, deltas, stop;
    message_delta; message_stop last."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.id = ""
        self.index = -1
        self.open = ""
        """The block under way: thinking, text or none."""
        self.sent = {"thinking": 0, "text": 0}

    def _start(self, kind: str) -> bytes:
        self.index += 1
        self.open = kind
        block = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def _stop(self, g: Generation) -> bytes:
        out = b""
        if self.open == "thinking":
            out += sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": "signature_delta", "signature": signature(g.reasoning)}})  # fmt: skip
        if self.open:
            out += sse("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.open = ""
        return out

    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        out = b""
        if not self.id:
            self.id = _id()
            out += sse(
                "message_start",
                {"type": "message_start", "message": _message(g, self.request, self.id, done=False)},
            )
        for kind, value, delta in (
            ("thinking", g.reasoning, "thinking_delta"),
            ("text", g.text, "text_delta"),
        ):
            if len(value) <= self.sent[kind]:
                continue
            if self.open != kind:
                out += self._stop(g) + self._start(kind)
            field = "thinking" if kind == "thinking" else "text"
            out += sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": delta, field: value[self.sent[kind] :]}})  # fmt: skip
            self.sent[kind] = len(value)
        return out

    def close(self, g: Generation) -> bytes:
        out = self.chunk(b"", {}, g)
        if not self.sent["text"] and not g.tool_calls:
            out += self._stop(g) + self._start("text")
        out += self._stop(g)
        for call in g.tool_calls:
            self.index += 1
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            arguments = json.dumps(call.parsed_arguments(), separators=(",", ":"))
            out += sse(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
            out += sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                               "delta": {"type": "input_json_delta", "partial_json": arguments}})  # fmt: skip
            out += sse("content_block_stop", {"type": "content_block_stop", "index": self.index})
        stop = _STOP.get(g.finish_reason, "end_turn")
        out += sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": g.output_tokens}})  # fmt: skip
        return out

    def terminal(self, g: Generation) -> bytes:
        return sse("message_stop", {"type": "message_stop"})
