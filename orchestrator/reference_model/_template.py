"""The chat template: messages and tools rendered into prompt token ids (ChatML with Hermes-style calls).

    <|im_start|>system\\n{system}\\n\\n# Tools\\n\\nYou may call these functions:\\n{one JSON per tool}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n                       <- generation starts here

Special tokens are inserted by id; message text never turns into a special
token, whatever it contains.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from orchestrator.reference_model._grammar import call_text
from orchestrator.reference_model._protocol import ChatMessage, FunctionTool
from orchestrator.reference_model._vocabulary import (
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Vocabulary,
)

TOOLS_HEADER = "# Tools\n\nYou may call these functions:\n"


def tools_text(tools: Sequence[FunctionTool]) -> str:
    """The tool listing: one canonical (sorted-key) JSON object per function."""
    lines = []
    for tool in tools:
        function: dict[str, object] = {"name": tool.name, "parameters": dict(tool.parameters)}
        if tool.description is not None:
            function["description"] = tool.description
        lines.append(json.dumps(function, sort_keys=True))
    return TOOLS_HEADER + "\n".join(lines)


def render_chat(
    vocabulary: Vocabulary, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]
) -> list[int]:
    """Prompt token ids for a conversation, ending with the open assistant turn."""
    ids: list[int] = []
    im_start, im_end = vocabulary.id_of(IM_START), vocabulary.id_of(IM_END)
    call_open, call_close = vocabulary.id_of(TOOL_CALL_OPEN), vocabulary.id_of(TOOL_CALL_CLOSE)

    def block(role: str, content: str, calls: Sequence[tuple[str, str]] = ()) -> None:
        ids.append(im_start)
        ids.extend(vocabulary.tokenize(f"{role}\n{content}"))
        for name, arguments in calls:
            ids.append(call_open)
            ids.extend(vocabulary.tokenize(call_text(name, arguments)))
            ids.append(call_close)
        ids.append(im_end)
        ids.extend(vocabulary.tokenize("\n"))

    rest = list(messages)
    if tools:
        listing = tools_text(tools)
        if rest and rest[0].role == "system":
            listing = f"{rest.pop(0).content}\n\n{listing}"
        block("system", listing)
    for message in rest:
        block(message.role, message.content, [(c.name, c.arguments) for c in message.tool_calls])
    ids.append(im_start)
    ids.extend(vocabulary.tokenize("assistant\n"))
    return ids
