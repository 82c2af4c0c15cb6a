"""The chat template: `tokenizer/chat_template.jinja` (Qwen3's format), rendered the way a model
server renders a Hugging Face chat template, then tokenised.

    <|im_start|>system\\n{system}\\n\\n# Tools\\n...<tools>\\n{tool JSON per line}\\n</tools>...<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{tool result}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                       <- generation starts here

The environment is the one Hugging Face's `apply_chat_template` gives a template: a sandbox,
`trim_blocks` and `lstrip_blocks`, loop controls, `tojson` without ASCII escapes and
`raise_exception`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.reference_model._protocol import ChatMessage, FunctionTool, invalid
from orchestrator.reference_model._vocabulary import TOKENIZER_DIR, Vocabulary

CHAT_TEMPLATE = TOKENIZER_DIR / "chat_template.jinja"


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> NoReturn:
    raise TemplateError(message)


@cache
def _template() -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(CHAT_TEMPLATE.read_text())


def _message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


def chat_text(messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], **options: Any) -> str:
    """The prompt text for a conversation, ending with the open assistant turn."""
    listed: list[Mapping[str, Any]] = [t.declaration for t in tools]
    try:
        return str(
            _template().render(
                messages=[_message(m) for m in messages],
                tools=listed or None,
                add_generation_prompt=True,
                **options,
            )
        )
    except TemplateError as exc:
        raise invalid("messages", f"the chat template refused them: {exc}") from None


def render_chat(
    vocabulary: Vocabulary, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], **options: Any
) -> list[int]:
    """Prompt token ids for a conversation, ending with the open assistant turn."""
    return vocabulary.tokenize(chat_text(messages, tools, **options))
