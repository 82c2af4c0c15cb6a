"""What an upstream's answer becomes: a `Generation`, read whole or chunk by chunk.

In text mode the upstream's own chat or completion answer is folded in as it comes. In token
mode the sampled ids are, and the model's parser reads text, reasoning and tool calls from them:
while they arrive, what has settled (a call not yet closed, trailing whitespace and half a
character are held back) so that what a harness is streamed always begins what it finally gets.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.gateway.dialects import Dialect, TokenSample
from orchestrator.gateway.generation import Generation, ToolCall, UpstreamFault
from orchestrator.gateway.rendering import ChatRenderer

PARSE_EVERY = 16
"""Sampled ids between two parses of a stream still arriving (the first parse comes at once)."""


class TextReader:
    """An upstream chat or completion answer, in the upstream's own protocol."""

    def __init__(self, kind: str) -> None:
        self.generation = Generation(kind)
        self._answered = False

    def add(self, data: dict[str, Any]) -> bool:
        """Fold in an answer or a streamed chunk; True: there is something to pass on."""
        try:
            self.generation.add(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UpstreamFault(
                f"the model server's answer is not a {self.generation.kind} completion: {exc}"
            ) from None
        self._answered = self._answered or bool(data.get("choices"))
        return True

    def finish(self) -> Generation:
        if not self._answered:
            raise UpstreamFault("the model server's response has no choices")
        self.generation.check()
        return self.generation


class TokenReader:
    """Sampled ids from a token-level route, parsed back with the model's own parser."""

    def __init__(
        self,
        kind: str,
        renderer: ChatRenderer,
        dialect: Dialect,
        prompt_ids: list[int],
        tools: Sequence[Mapping[str, Any]] | None,
        model: str,
    ) -> None:
        self.renderer, self.dialect = renderer, dialect
        self.prompt_ids, self.tools = prompt_ids, tools
        self.sample = TokenSample()
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.generation = Generation(
            kind, "tokens", model=model, response_id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time())
        )
        self._parsed_at = 0

    def add(self, data: dict[str, Any]) -> bool:
        """Fold in an answer or a streamed chunk; True: text or reasoning grew."""
        try:
            self.dialect.add(self.sample, data)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise UpstreamFault(
                f"the model server's answer is not a {self.dialect.name} generation: {exc}"
            ) from None
        ids = self.sample.token_ids
        g = self.generation
        if not ids or ((g.text or g.reasoning) and len(ids) - self._parsed_at < PARSE_EVERY):
            return False
        self._parsed_at = len(ids)
        return self._read(final=False)

    def _read(self, *, final: bool) -> bool:
        g = self.generation
        if g.kind == "completion":
            text, reasoning = (
                self.renderer.tokenizer.decode(self.sample.token_ids, skip_special_tokens=True),
                "",
            )
        else:
            parsed = self.renderer.parse(self.sample.token_ids, self.prompt_ids, self.tools, final=final)
            # Stripped as parsers strip a closed block, whether or not this one is closed yet.
            text, reasoning = parsed.content.strip(), (parsed.reasoning or "").strip()
            if final:
                g.tool_calls = [ToolCall(id="", name=c.name, arguments=c.arguments) for c in parsed.calls]
        if not final:
            text, reasoning = _settled(text), _settled(reasoning)
        grew = False
        for name, value in (("text", text), ("reasoning", reasoning)):
            if value.startswith(getattr(g, name)) and value != getattr(g, name):
                setattr(g, name, value)
                grew = True
        return grew

    def finish(self) -> Generation:
        self.sample.check(self.prompt_ids)
        g = self.generation
        sent = (g.text, g.reasoning)
        g.text = g.reasoning = ""
        self._read(final=True)
        if not (g.text.startswith(sent[0]) and g.reasoning.startswith(sent[1])):
            raise UpstreamFault("the parsed answer does not begin with what was streamed of it")
        s = self.sample
        done = Generation.from_tokens(
            g.kind, self.prompt_ids, s.token_ids, s.logprobs, s.finish_reason,
            text=g.text, reasoning=g.reasoning, tool_calls=g.tool_calls, model=g.model,
            response_id=g.response_id, policy_version=s.policy_version, created=g.created,
            token_texts=[self.renderer.token_text(t) for t in s.token_ids],
        )  # fmt: skip
        self.generation = done
        return done


def _settled(text: str) -> str:
    """What of a stream's text cannot change any more: not half a character at its end, nor the
    whitespace before it (a parser strips the end of a block)."""
    return text.rstrip("\ufffd").rstrip()


def loads(body: bytes) -> dict[str, Any]:
    """An upstream's whole answer as JSON; UpstreamFault if it is none."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise UpstreamFault(f"the model server's answer is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UpstreamFault("the model server's answer is not a JSON object")
    return data
