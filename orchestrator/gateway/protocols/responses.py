"""OpenAI Responses (`POST /v1/responses`, what Codex speaks), translated onto chat completions.

Input items become chat messages: `message` items keep their role (`developer` is `system`) and
content parts, `function_call` and `custom_tool_call` items become the assistant's tool calls,
their `*_output` items tool results, and a `reasoning` item the reasoning of the assistant message
it opens (its `reasoning_text` content, else its summary). Function tools become chat tools; a
custom (free-form) tool becomes a function with one string parameter, `input`. Nothing is stored:
`previous_response_id` is refused.

The model's reasoning comes back as a `reasoning` item before the message, its text both as the
summary and as `reasoning_text` content (streamed as reasoning summary text deltas), with no
encrypted content: there is nothing to hide, and a harness sends the item back as it got it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from orchestrator.gateway.generation import Generation, ToolCall
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
    "store", "include", "reasoning", "metadata", "user", "prompt_cache_key", "service_tier", "truncation",
    "background", "safety_identifier", "stream_options", "max_tool_calls", "top_logprobs",
)  # fmt: skip
"""Responses fields with no meaning for an open-weights upstream; see docs/harnesses.md."""
KNOWN = {
    "model", "input", "seed", "instructions", "tools", "tool_choice", "stream", "max_output_tokens", "temperature",
    "top_p", "parallel_tool_calls", "text", "previous_response_id", "conversation", *DROPPED,
}  # fmt: skip
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _parts(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise GatewayError(400, f"{where}.content: must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image":
            parts.append(
                {"type": "image_url", "image_url": {"url": part.get("image_url") or part.get("file_id")}}
            )
        else:
            raise GatewayError(400, f"{where}.content[{i}]: content part type {kind!r} is not supported")
    return parts


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return json.dumps(output)


def _reasoning(item: dict[str, Any]) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == kind]
            if texts:
                return "".join(texts)
    return ""


def to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise GatewayError(400, "input: must be a string or a non-empty list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise GatewayError(400, f"{where}: must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        last = messages[-1] if messages else None
        opened = last is not None and last["role"] == "assistant" and last.get("content") is None
        if kind == "message":
            role = _ROLES.get(str(item.get("role")))
            if role is None:
                raise GatewayError(
                    400, f"{where}.role: {item.get('role')!r} is not user, assistant, system or developer"
                )
            content = _parts(item.get("content"), where)
            if role == "assistant" and opened and last is not None and not last.get("tool_calls"):
                last["content"] = content  # the message of a turn whose reasoning came first
            else:
                messages.append({"role": role, "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            arguments = (
                item.get("arguments")
                if kind == "function_call"
                else json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
            )
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": str(arguments or "")}}  # fmt: skip
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id", "")),
                    "content": _output_text(item.get("output")),
                }
            )
        elif kind == "reasoning":
            messages.append({"role": "assistant", "content": None, "reasoning_content": _reasoning(item)})
        else:
            raise GatewayError(400, f"{where}.type: input item type {kind!r} is not supported")
    # A turn of reasoning alone reads as an assistant message with empty content.
    for m in messages:
        if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            m["content"] = ""
    return messages


def to_tools(tools: Any) -> tuple[list[dict[str, Any]], set[str], list[str]]:
    """Chat tools, the names of custom tools, and the tools left out (hosted ones)."""
    out, custom, dropped = [], set(), []
    for i, tool in enumerate(listed(tools, "tools")):
        if not isinstance(tool, dict):
            raise GatewayError(400, f"tools[{i}]: must be an object")
        kind, name = tool.get("type"), str(tool.get("name", ""))
        if kind == "function":
            function = {"name": name, "description": tool.get("description") or "",
                        "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}  # fmt: skip
        elif kind == "custom":
            custom.add(name)
            described = mapped(tool.get("format"), f"tools[{i}].format").get("definition") or "free-form text"
            function = {
                "name": name,
                "description": tool.get("description") or "",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string", "description": str(described)[:2000]}},
                    "required": ["input"],
                },
            }
        else:
            dropped.append(f"tools[{i}] ({kind})")
            continue
        if not name:
            raise GatewayError(400, f"tools[{i}].name: is required")
        out.append({"type": "function", "function": function})
    return out, custom, dropped


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise GatewayError(400, "tool_choice: must be auto, none, required or {type: function, name}")


class Responses(Protocol):
    name = "responses"

    def parse(self, body: dict[str, Any]) -> Request:
        require(body, "model", str, "a model name")
        if body.get("previous_response_id") or body.get("conversation"):
            raise GatewayError(
                400, "previous_response_id: the Stasis gateway stores no responses; send the whole input"
            )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise GatewayError(400, "stream: must be a boolean")
        tools, custom, dropped = to_tools(body.get("tools"))
        upstream: dict[str, Any] = {
            "model": body["model"],
            "messages": to_messages(body),
            **pick(body, {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                          "parallel_tool_calls": "parallel_tool_calls", "seed": "seed"}),
        }  # fmt: skip
        if tools:
            upstream["tools"] = tools
            if body.get("tool_choice") is not None:
                upstream["tool_choice"] = _tool_choice(body["tool_choice"])
        fmt = mapped(mapped(body.get("text"), "text").get("format"), "text.format")
        if fmt.get("type") == "json_schema":
            upstream["response_format"] = {
                "type": "json_schema",
                "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt},
            }
        elif fmt.get("type") == "json_object":
            upstream["response_format"] = {"type": "json_object"}
        dropped += [k for k in body if k in DROPPED]
        dropped += [k for k in body if k not in KNOWN]
        canonical = CanonicalRequest.parse("chat", upstream, protocol=self.name, stream=stream)
        echo = {
            k: body.get(k)
            for k in (
                "tools",
                "tool_choice",
                "temperature",
                "top_p",
                "instructions",
                "parallel_tool_calls",
                "max_output_tokens",
            )
        }
        return Request(
            "/chat/completions", upstream, canonical, stream, tuple(dropped), {"custom": custom, **echo}
        )

    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        return json.dumps(_response(g, request, _ids(g), "completed")).encode()

    def encoder(self, request: Request, tokens: bool = False) -> StreamEncoder:
        return _Events(request)

    def stream_error(self, err: GatewayError) -> bytes:
        return sse("error", {"type": "error", "code": err.kind, "message": str(err), "param": None})


def _ids(g: Generation) -> dict[str, str]:
    base = uuid.uuid4().hex[:24]
    return {
        "response": f"resp_{base}",
        "message": f"msg_{base}",
        "call": f"fc_{base}",
        "reasoning": f"rs_{base}",
    }


def _reasoning_item(g: Generation, ids: dict[str, str], status: str) -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": ids["reasoning"], "type": "reasoning", "status": status,
        "summary": [{"type": "summary_text", "text": g.reasoning}] if done else [],
        "content": [{"type": "reasoning_text", "text": g.reasoning}] if done else [],
        "encrypted_content": None,
    }  # fmt: skip


def _message(g: Generation, ids: dict[str, str], status: str) -> dict[str, Any]:
    return {
        "id": ids["message"], "type": "message", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": g.text, "annotations": []}] if status == "completed" else [],
    }  # fmt: skip


def _call(call: ToolCall, index: int, ids: dict[str, str], request: Request, status: str) -> dict[str, Any]:
    done = status == "completed"
    if call.name in request.echo["custom"]:
        text = str(call.parsed_arguments().get("input", "")) if done else ""
        return {"id": f"{ids['call']}_{index}", "type": "custom_tool_call", "status": status,
                "call_id": call.id, "name": call.name, "input": text}  # fmt: skip
    return {"id": f"{ids['call']}_{index}", "type": "function_call", "status": status, "call_id": call.id,
            "name": call.name, "arguments": call.arguments if done else ""}  # fmt: skip


def _response(g: Generation, request: Request, ids: dict[str, str], status: str) -> dict[str, Any]:
    output = []
    if status == "completed":
        if g.reasoning:
            output.append(_reasoning_item(g, ids, "completed"))
        if g.text or not g.tool_calls:
            output.append(_message(g, ids, "completed"))
        output += [_call(c, i, ids, request, "completed") for i, c in enumerate(g.tool_calls)]
    truncated = status == "completed" and g.finish_reason == "length"
    echo = request.echo
    return {
        "id": ids["response"],
        "object": "response",
        "created_at": g.created or int(time.time()),
        "status": "incomplete" if truncated else status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "model": g.model or str(request.upstream["model"]),
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "temperature": echo.get("temperature"),
        "tool_choice": echo.get("tool_choice") or "auto",
        "tools": echo.get("tools") or [],
        "top_p": echo.get("top_p"),
        "store": False,
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": g.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": g.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": g.input_tokens + g.output_tokens,
        },
    }


class _Events(StreamEncoder):
    """created, in_progress, then per output item (reasoning, message, tool calls): added, its
    deltas, done; completed last."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.ids: dict[str, str] = {}
        self.seq = 0
        self.index = -1
        self.open = ""
        """The item under way: reasoning, message or none."""
        self.sent = {"reasoning": 0, "message": 0}

    def _event(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return sse(kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def _start(self, kind: str, g: Generation) -> bytes:
        self.index += 1
        self.open = kind
        if kind == "reasoning":
            item = _reasoning_item(g, self.ids, "in_progress")
            return self._event("response.output_item.added", output_index=self.index, item=item) + self._event(
                "response.reasoning_summary_part.added", item_id=self.ids["reasoning"], output_index=self.index,
                summary_index=0, part={"type": "summary_text", "text": ""},
            )  # fmt: skip
        return self._event(
            "response.output_item.added", output_index=self.index, item=_message(g, self.ids, "in_progress")
        ) + self._event("response.content_part.added", item_id=self.ids["message"], output_index=self.index,
                        content_index=0, part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip

    def _stop(self, g: Generation) -> bytes:
        out = b""
        if self.open == "reasoning":
            at = {"item_id": self.ids["reasoning"], "output_index": self.index, "summary_index": 0}
            out += self._event("response.reasoning_summary_text.done", **at, text=g.reasoning)
            out += self._event("response.reasoning_summary_part.done", **at,
                               part={"type": "summary_text", "text": g.reasoning})  # fmt: skip
            out += self._event(
                "response.output_item.done",
                output_index=self.index,
                item=_reasoning_item(g, self.ids, "completed"),
            )
        elif self.open == "message":
            at = {"item_id": self.ids["message"], "output_index": self.index, "content_index": 0}
            out += self._event("response.output_text.done", **at, text=g.text)
            out += self._event("response.content_part.done", **at,
                               part={"type": "output_text", "text": g.text, "annotations": []})  # fmt: skip
            out += self._event(
                "response.output_item.done", output_index=self.index, item=_message(g, self.ids, "completed")
            )
        self.open = ""
        return out

    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        out = b""
        if not self.ids:
            self.ids = _ids(g)
            started = _response(g, self.request, self.ids, "in_progress")
            out += self._event("response.created", response=started)
            out += self._event("response.in_progress", response=started)
        for kind, value in (("reasoning", g.reasoning), ("message", g.text)):
            if len(value) <= self.sent[kind]:
                continue
            if self.open != kind:
                out += self._stop(g) + self._start(kind, g)
            delta = value[self.sent[kind] :]
            if kind == "reasoning":
                out += self._event("response.reasoning_summary_text.delta", item_id=self.ids["reasoning"],
                                   output_index=self.index, summary_index=0, delta=delta)  # fmt: skip
            else:
                out += self._event("response.output_text.delta", item_id=self.ids["message"],
                                   output_index=self.index, content_index=0, delta=delta)  # fmt: skip
            self.sent[kind] = len(value)
        return out

    def close(self, g: Generation) -> bytes:
        out = self.chunk(b"", {}, g)
        if not self.sent["message"] and not g.tool_calls:
            out += self._stop(g) + self._start("message", g)
        out += self._stop(g)
        for i, call in enumerate(g.tool_calls):
            self.index += 1
            item = _call(call, i, self.ids, self.request, "in_progress")
            done = _call(call, i, self.ids, self.request, "completed")
            out += self._event("response.output_item.added", output_index=self.index, item=item)
            if item["type"] == "custom_tool_call":
                at = {"item_id": item["id"], "output_index": self.index}
                out += self._event("response.custom_tool_call_input.delta", **at, delta=done["input"])
                out += self._event("response.custom_tool_call_input.done", **at, input=done["input"])
            else:
                at = {"item_id": item["id"], "output_index": self.index}
                out += self._event("response.function_call_arguments.delta", **at, delta=call.arguments)
                out += self._event("response.function_call_arguments.done", **at, arguments=call.arguments)
            out += self._event("response.output_item.done", output_index=self.index, item=done)
        return out

    def terminal(self, g: Generation) -> bytes:
        return self._event("response.completed", response=_response(g, self.request, self.ids, "completed"))
