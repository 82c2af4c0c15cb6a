"""The canonical form of a model request: what makes two requests the same turn, and the prefix
hashes that find a request's parent in the ledger. The rule is in `ledger`'s docstring and in
docs/trajectory.md."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_SAMPLING = (
    "model", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "tools",
    "tool_choice", "response_format", "presence_penalty", "frequency_penalty", "logit_bias", "n",
)  # fmt: skip


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content).replace("\r\n", "\n").strip()


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw.strip()
    return raw


def canonical_message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise ValueError("every message must be an object")
    out: dict[str, Any] = {"role": str(m.get("role", "")), "content": _text(m.get("content"))}
    if m.get("name"):
        out["name"] = m["name"]
    calls = m.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "name": (c.get("function") or {}).get("name", ""),
                "arguments": _arguments((c.get("function") or {}).get("arguments")),
            }
            for c in calls
        ]
    return out


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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

    @classmethod
    def parse(cls, kind: str, body: dict[str, Any]) -> CanonicalRequest:
        params = {k: body[k] for k in _SAMPLING if k in body and body[k] is not None}
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages: must be a non-empty list")
            return cls(kind, tuple(canonical_message(m) for m in messages), params)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("prompt: must be a string")
        return cls(kind, (prompt,), params)

    @property
    def fingerprint(self) -> str:
        return _digest([self.kind, list(self.context), self.params])

    def prefix_hashes(self, lengths: Sequence[int]) -> list[str]:
        """Hashes of the conversation's proper prefixes of the given lengths, longest first.

        Lengths count messages for chat and characters for completions; the ledger asks only
        for lengths at which some recorded conversation ends.
        """
        wanted = sorted((n for n in set(lengths) if 0 < n < self.size), reverse=True)
        if self.kind == "chat":
            rolling = _rolling(self.context)
            return [rolling[n - 1] for n in wanted]
        return [_digest(["completion", self.context[0][:n]]) for n in wanted]

    @property
    def size(self) -> int:
        return len(self.context) if self.kind == "chat" else len(self.context[0])

    def after(self, answer: Any) -> tuple[str, int]:
        """Identity and length of the conversation once this request's answer is appended."""
        if self.kind == "chat":
            return _rolling([*self.context, answer])[-1], len(self.context) + 1
        text = self.context[0] + answer
        return _digest(["completion", text]), len(text)
