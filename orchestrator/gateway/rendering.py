"""A model's chat template, offline: messages rendered to token ids, a conversation extended by
the tokens it already has, and sampled ids parsed back into text, reasoning and tool calls.

The work is `renderers`' (per model family: Qwen3, DeepSeek, Kimi, GLM, Llama, ...), over a local
`tokenizer.json` read with Hugging Face's `tokenizers`; nothing is fetched from a hub. This
module adapts the gateway's chat messages to it and its answers to the gateway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderers import ToolCallParseStatus, config_from_name, create_renderer
from tokenizers import Tokenizer

from orchestrator.gateway.protocols import GatewayError

THINKING_RETENTION = "all"
"""Earlier reasoning stays in later prompts, so every prompt extends the tokens before it across
user turns too (a template that drops it would make each new user turn a break)."""


PROMPT_TAIL = 1024
"""How much of a prompt's end a template reads to extend it or to parse what follows it (its
last turn's header, a prefilled reasoning block): the renderers are given that much, so that
their cost grows with what is added, not with the conversation (they copy what they are given)."""


class RendererUnavailable(ValueError):
    """The configured renderer or tokenizer cannot be loaded; the message says which and why."""


class _Tokenizer:
    """`tokenizers.Tokenizer` as `renderers` asks for one (encode, decode, token lookups)."""

    def __init__(self, directory: Path) -> None:
        path = directory / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise RendererUnavailable(
                f"tokenizer {path}: cannot be read as a tokenizer.json: {exc}"
            ) from None
        self.name_or_path = str(directory)
        self.unk_token_id = self._lookup(_config(directory).get("unk_token"))
        self.eos_token_id = self._lookup(_config(directory).get("eos_token"))

    def _lookup(self, token: Any) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        return self._tokenizer.token_to_id(token) if isinstance(token, str) else None

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Any, *args: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            found = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]


def _config(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class ToolCallText:
    name: str
    arguments: str
    """The arguments exactly as the model wrote them (a JSON object's text)."""


@dataclass(frozen=True)
class Parsed:
    """Sampled ids read back as a chat endpoint would give them."""

    content: str
    reasoning: str | None
    calls: list[ToolCallText]
    """Empty when the model made no call, or when a call did not parse (then `content` holds the
    raw text, as model servers answer a malformed call)."""


class ChatRenderer:
    """One model's chat template and parser, over its tokenizer directory."""

    def __init__(self, name: str, tokenizer_dir: Path, options: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.tokenizer = _Tokenizer(tokenizer_dir)
        try:
            default = config_from_name(name) if name != "auto" else None
        except ValueError as exc:
            raise RendererUnavailable(f"renderer {name!r}: {exc}") from None
        if default is None:
            raise RendererUnavailable(
                f"renderer {name!r}: name one (qwen3, qwen3.5, glm-4.5, kimi-k2, ...), not auto"
            )
        try:
            config = type(default)(**{"thinking_retention": THINKING_RETENTION, **(options or {})})
        except ValueError as exc:
            raise RendererUnavailable(f"renderer {name!r}: {exc}") from None
        try:
            self._renderer = create_renderer(self.tokenizer, config)
        except (AssertionError, KeyError, ValueError) as exc:
            raise RendererUnavailable(f"renderer {name!r} over {tokenizer_dir}: {exc}") from None
        self.stop_ids: list[int] = list(self._renderer.get_stop_token_ids())

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """The whole prompt of a conversation, ending with the open assistant turn."""
        rendered = self._renderer.render(_messages(messages), tools=_tools(tools), add_generation_prompt=True)
        return list(rendered.token_ids)

    def bridge(
        self,
        prompt_ids: Sequence[int],
        sampled_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> list[int] | None:
        """The prompt that extends an earlier prompt and its sampled ids, as sampled, with only the
        new messages rendered; None where the template cannot (then the prompt is rendered whole)."""
        cut = max(0, len(prompt_ids) - PROMPT_TAIL)
        bridged = self._renderer.bridge_to_next_turn(
            list(prompt_ids[cut:]), list(sampled_ids), _messages(new_messages), tools=_tools(tools)
        )
        # The renderer's answer begins with the prompt's end it was given, as it was given it.
        return None if bridged is None else [*prompt_ids[:cut], *bridged.token_ids]

    def parse(
        self,
        sampled_ids: Sequence[int],
        prompt_ids: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        final: bool = True,
    ) -> Parsed:
        """Sampled ids as text, reasoning and tool calls, with the model's own parser. Of ids still
        arriving (`final=False`), a call not yet closed is left out."""
        ids = list(sampled_ids)
        parsed = self._renderer.parse_response(
            ids, prompt_ids=list(prompt_ids[-PROMPT_TAIL:]), tools=_tools(tools)
        )
        calls = parsed.tool_calls
        if any(c.status != ToolCallParseStatus.OK for c in calls):
            if not final:
                return Parsed(parsed.content, parsed.reasoning_content, [])
            # As model servers answer a call that does not parse: its raw text, after the content.
            stops = set(self.stop_ids)
            body = [t for t in ids if t not in stops]
            start = calls[0].token_span[0] if calls[0].token_span else 0
            raw = self.tokenizer.decode(body[start:]) if start else self.tokenizer.decode(body)
            content = f"{parsed.content}\n{raw}" if parsed.content and start else raw
            return Parsed(content, parsed.reasoning_content, [])
        return Parsed(
            parsed.content,
            parsed.reasoning_content,
            [ToolCallText(c.name or "", _arguments_text(c.raw, c.arguments)) for c in calls],
        )

    def token_text(self, token_id: int) -> str:
        """A token's own text (its bytes decoded; specials spelled out)."""
        return self.tokenizer.decode([token_id])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The gateway's chat messages as `renderers` takes them: text content, tool calls with their
    arguments text, reasoning where a harness sent it back."""
    out = []
    for i, m in enumerate(messages):
        message: dict[str, Any] = {
            "role": m.get("role"),
            "content": _text(m.get("content"), f"messages[{i}].content"),
        }
        for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            if m.get(key) is not None:
                message[key] = m[key]
        out.append(message)
    return out


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text":
            parts.append(str(part.get("text", "")))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise GatewayError(
                400,
                f"{where}[{j}]: a {kind!r} part cannot be rendered to tokens: the model's template takes text",
            )
    return "".join(parts)


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> Any:
    return [dict(t) for t in tools] if tools else None


def _arguments_text(raw: str, parsed: Any) -> str:
    """The text of the `arguments` member of a call's JSON object, as the model wrote it; its
    re-serialisation only if the text cannot be walked."""
    decoder = json.JSONDecoder()
    try:
        i = raw.index("{") + 1
        while True:
            i = _skip(raw, i)
            if raw[i] == "}":
                break
            key, i = decoder.raw_decode(raw, i)
            i = _skip(raw, i)
            if raw[i] != ":":
                break
            start = _skip(raw, i + 1)
            value, end = decoder.raw_decode(raw, start)
            if key == "arguments":
                return value if isinstance(value, str) else raw[start:end]
            i = _skip(raw, end)
            if raw[i] == ",":
                i += 1
    except (ValueError, IndexError):
        pass
    return (
        parsed
        if isinstance(parsed, str)
        else json.dumps(parsed if parsed is not None else {}, ensure_ascii=False)
    )


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
