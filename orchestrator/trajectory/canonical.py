"""The canonical form of a model request: what makes two requests the same turn, and the prefix
hashes that find a request's parent in the ledger.

Every protocol is translated to a chat (or legacy completion) request first, so one form serves
them all. Everything that changes what the model sees is part of a request's identity: roles,
names, text, non-text content parts, tool calls, tool results with the id of the call they
answer, and every request parameter. A tool call with an id is known by its id and name: the
model's call, however a harness re-serialises its arguments (the gateway prompts the model with
the tokens it sampled for it); one without an id by its canonical arguments. What is only
serialisation noise is not part of the identity: line endings and surrounding whitespace in text,
text split into parts, None for empty content, key order and spacing in tool-argument JSON,
reasoning a harness sends back or leaves out, and `1.0` against `1`. The rule is also in
docs/trajectory.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

TRANSPORT = frozenset(
    {
        "messages", "prompt", "stream", "stream_options", "user", "metadata", "store", "service_tier",
        "logprobs", "top_logprobs", "return_token_ids", "return_tokens_as_token_ids", "echo",
    }
)  # fmt: skip
"""Upstream request fields that do not change what is sampled, or that the gateway sets itself."""


def normal(value: Any) -> Any:
    """JSON data with numbers in one form: an integral float is the integer."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value


def _text(text: Any) -> str:
    return str(text).replace("\r\n", "\n").strip()


def _content(content: Any) -> Any:
    """Text parts join into one string; any other part stays, so it is part of the identity."""
    if content is None:
        return ""
    if not isinstance(content, list):
        return _text(content)
    text, others = [], []
    for part in content:
        if isinstance(part, dict) and part.get("type", "text") == "text":
            text.append(str(part.get("text", "")))
        elif isinstance(part, str):
            text.append(part)
        else:
            others.append(normal(part))
    joined = _text("".join(text))
    return joined if not others else {"text": joined, "parts": others}


def arguments_object(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as every harness is given them: an object, nothing as {}, and
    anything else (a list, a number, text that is not JSON) wrapped as {"input": ...}. `raw` is
    the model's text, or what a harness sent back, which may be an object already."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {"input": raw}
    else:
        value = raw
    return value if isinstance(value, dict) else {"input": value}


def _arguments(raw: Any) -> Any:
    """A call's arguments as the harness was given them: an Anthropic or Responses harness sends
    back the object it got, not what the model wrote, and that is the same call."""
    return normal(arguments_object(raw))


def canonical_message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise ValueError("every message must be an object")
    out: dict[str, Any] = {"role": str(m.get("role", "")), "content": _content(m.get("content"))}
    for key in ("name", "tool_call_id"):
        if m.get(key):
            out[key] = str(m[key])
    calls = m.get("tool_calls") or []
    if calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError("tool_calls: must be a list of objects")
        functions = [c.get("function") or {} for c in calls]
        if not all(isinstance(f, dict) for f in functions):
            raise ValueError("tool_calls[].function: must be an object")
        out["tool_calls"] = [_call(str(c.get("id") or ""), f) for c, f in zip(calls, functions, strict=True)]
    return out


def _call(call_id: str, function: dict[str, Any]) -> dict[str, Any]:
    """A tool call is known by its id where it has one: the model's call, however a harness
    re-serialises its arguments; else by its name and canonical arguments."""
    if call_id:
        return {"id": call_id, "name": function.get("name", "")}
    return {"id": "", "name": function.get("name", ""), "arguments": _arguments(function.get("arguments"))}


def _digest(value: Any) -> str:
    """A digest of JSON data by its structure: each string's bytes are hashed as they are, with
    no serialisation to escape them first, so a long conversation's cost is its bytes once."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(data))
        h.update(data)
    elif isinstance(value, bool) or value is None:
        h.update({True: b"T", False: b"F", None: b"N"}[value])
    elif isinstance(value, int):
        h.update(b"i%d;" % value)
    elif isinstance(value, float):
        h.update(b"f%r;" % value)
    elif isinstance(value, dict):
        h.update(b"d%d:" % len(value))
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, list | tuple):
        h.update(b"l%d:" % len(value))
        for item in value:
            _feed(h, item)
    else:
        _feed(h, str(value))


def _text_digest(text: str) -> str:
    """A completion's identity: the digest of its prompt text's JSON, which a prompt's prefixes
    can be hashed along with (`CanonicalRequest.prefix_hashes`)."""
    return hashlib.sha256(json.dumps(["completion", text], separators=(",", ":")).encode()).hexdigest()


def _rolling(items: Sequence[Any]) -> list[str]:
    """hashes[k] identifies items[:k+1], so every prefix of a conversation has its own hash."""
    hashes, h = [], ""
    for item in items:
        h = hashlib.sha256((h + _digest(item)).encode()).hexdigest()
        hashes.append(h)
    return hashes


@dataclass(frozen=True)
class CanonicalRequest:
    kind: str
    """chat | completion"""
    context: tuple[Any, ...]
    """Canonical messages (chat), or the prompt as one item (completion)."""
    params: dict[str, Any]
    """Every other request field that changes what is sampled or how it is delivered."""

    @classmethod
    def parse(cls, kind: str, body: dict[str, Any], **delivery: Any) -> CanonicalRequest:
        """The canonical form of an upstream chat or completion body. `delivery` (the harness's
        protocol, streaming or not) is part of the identity: it decides the bytes delivered."""
        params = normal({k: v for k, v in body.items() if k not in TRANSPORT and v is not None})
        params.update(delivery)
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages: must be a non-empty list")
            return cls(kind, tuple(canonical_message(m) for m in messages), params)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("prompt: must be a string")
        return cls(kind, (prompt,), params)

    @cached_property
    def fingerprint(self) -> str:
        conversation = self._rolling[-1] if self.kind == "chat" else _text_digest(self.context[0])
        return hashlib.sha256(f"{self.kind}:{conversation}:{_digest(self.params)}".encode()).hexdigest()

    @cached_property
    def tools_key(self) -> str:
        """Digest of the tools offered: a prompt extends a parent's tokens only under the same."""
        tools = self.params.get("tools")
        return _digest(tools) if tools else ""

    @cached_property
    def _rolling(self) -> list[str]:
        return _rolling(self.context)

    def prefix_hashes(self, lengths: Sequence[int] = ()) -> list[str]:
        """Hashes of the conversation's proper prefixes, longest first: every one for chat
        (lengths count messages), those of the given lengths for completions (characters; the
        ledger asks only for lengths at which some recorded prompt ends)."""
        if self.kind == "chat":
            return self._rolling[-2::-1]
        # _text_digest(text[:n]) for each n, in one pass over the text: JSON escapes each
        # character alone, so the JSON of a prefix is a prefix of the JSON of the text.
        text, done, hashes = self.context[0], 0, []
        h = hashlib.sha256(b'["completion","')
        for n in sorted(n for n in set(lengths) if 0 < n < self.size):
            h.update(json.dumps(text[done:n])[1:-1].encode())
            done = n
            closed = h.copy()
            closed.update(b'"]')
            hashes.append(closed.hexdigest())
        return hashes[::-1]

    @property
    def size(self) -> int:
        return len(self.context) if self.kind == "chat" else len(self.context[0])

    def after(self, answer: Any) -> tuple[str, int]:
        """Identity and length of the conversation once this request's answer is appended."""
        if self.kind == "chat":
            last = self._rolling[-1] if self._rolling else ""
            return hashlib.sha256((last + _digest(answer)).encode()).hexdigest(), len(self.context) + 1
        text = self.context[0] + answer
        return _text_digest(text), len(text)
