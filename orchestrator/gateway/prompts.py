"""Prompts as token ids (token-in-token-out): the tokens a recorded turn was prompted with and
sampled, as they were, plus only the new messages rendered by the model's template.

A request continues the recorded turn whose conversation is the longest prefix of its own (the
ledger's parent). Its prompt is that turn's prompt ids, its sampled ids, then the rendering of
the messages the harness added since (tool results, a user turn): never the harness's
re-serialisation of what the model said. Where that cannot hold (no parent, a parent sampled in
text mode, other tools, an assistant message the model never wrote among the new ones, a
template that cannot extend), the whole conversation is rendered, and the turn says whether and
where that prompt leaves the tokens before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.gateway.protocols import Request
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.trajectory.turns import Lineage, Turn, extension


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    lineage: Lineage


def chat_prompt(renderer: ChatRenderer, parent: Turn | None, request: Request) -> Prompt:
    """The prompt ids of a chat request (see the module docstring)."""
    messages: Sequence[Mapping[str, Any]] = request.upstream["messages"]
    tools = request.upstream.get("tools")
    reason = _why_not_extended(parent, request, messages)
    if parent is not None and not reason:
        new = messages[parent.after_len :]
        ids = renderer.bridge(parent.prompt_token_ids, parent.token_ids, new, tools)
        if ids is not None:
            # The bridge keeps the earlier prompt as it was given it, so only the sampled ids
            # (which it may trim after a stop token) need checking, not the whole history.
            start, sampled = len(parent.prompt_token_ids), parent.token_ids
            if (
                ids[start : start + len(sampled)] == sampled
                and ids[: min(start, 64)] == parent.prompt_token_ids[:64]
            ):
                return Prompt(ids, Lineage(parent.id, True, start + len(sampled)))
            return Prompt(ids, extension(parent, ids))
        reason = f"the {renderer.name} template cannot extend the tokens so far with these messages"
    ids = renderer.render(messages, tools)
    return Prompt(ids, extension(parent, ids, reason))


def completion_prompt(renderer: ChatRenderer, parent: Turn | None, request: Request) -> Prompt:
    """The prompt ids of a legacy completion: the parent's prompt and sampled ids, then the new
    text tokenised (no template)."""
    text: str = request.canonical.context[0]
    if parent is not None and parent.mode == "tokens":
        ids = [*parent.prompt_token_ids, *parent.token_ids, *renderer.encode(text[parent.after_len :])]
        return Prompt(ids, extension(parent, ids))
    ids = renderer.encode(text)
    return Prompt(ids, extension(parent, ids, "the prompt before was sampled in text mode"))


def _why_not_extended(parent: Turn | None, request: Request, messages: Sequence[Mapping[str, Any]]) -> str:
    if parent is None:
        return ""
    if parent.mode != "tokens":
        return "the turn before was sampled in text mode"
    if parent.tools_key != request.canonical.tools_key:
        return "the tools differ from those the tokens so far were prompted with"
    if any(m.get("role") == "assistant" for m in messages[parent.after_len :]):
        return "the new messages hold an assistant message the model did not sample"
    return ""
