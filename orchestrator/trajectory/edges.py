"""What each recorded turn is to the trajectory's tree: the kind of its edge and the turn it hangs
from, told by what its request looks like (its system prompt, the tools it lists, its messages)
and by the turns recorded before it. Pure functions; `ledger` applies them when it records a turn.

The rules (also in docs/trajectory.md):

- A request that continues a recorded conversation (it has a parent) asking, in its last user
  message, for a summary of the conversation is a **compaction**, hung from that parent.
- Another request with a parent is a **continuation** of it, on its branch; a **parallel**
  sibling, on a branch of its own, if a live child of the parent holds that branch; a **restore
  divergence** if it takes the branch over from children the restored harness never had (they
  are abandoned).
- In a fork child, a request whose parent is a turn it shares with its parent episode (recorded
  before the fork's snapshot) is a **fork** from it, on its branch, unless one of the above.
- A request with no parent, in this order: one whose first user message carries on from a
  summary ("This session is being continued from a previous conversation", or a recorded
  compaction's answer) is a **continuation** across that compaction, hung from the compaction
  turn (none if no compaction was recorded), on the branch of the conversation it summarised
  (main's if none); one whose first user message holds the
  `prompt` argument of a tool call a recorded turn made (Claude Code's Task tool) is a
  **subagent**, hung from that turn; the first is the **root** of the primary conversation; the
  primary's first request asked again is a **parallel** sibling; one that lists no tools while
  the primary lists them is a **side call** (a title, a topic check, a small-model call); one
  that lists tools while the primary is a lone turn listing none makes that turn a side call and
  becomes the root; any other is a **subagent** whose spawning call cannot be told.

Main is the primary conversation followed across compactions: never a side call, a subagent or a
compaction's summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator.trajectory.canonical import CanonicalRequest, arguments_object


class Edge(StrEnum):
    """How a recorded turn hangs from the one before it in the tree."""

    ROOT = "root"
    """The first turn of the primary conversation."""
    CONTINUATION = "continuation"
    PARALLEL = "parallel"
    SUBAGENT = "subagent"
    SIDE_CALL = "side_call"
    COMPACTION = "compaction"
    DIVERGENCE = "divergence"
    FORK = "fork"
    """A fork child's first turn below a turn it shares with its parent episode (recorded before
    the fork's snapshot): the child's conversation goes on from there, on that turn's branch."""


SUMMARY_REQUEST = re.compile(r"\bsummar(y|ise|ize)\b[^\n]{0,80}\b(the|this)\s+conversation\b", re.IGNORECASE)
"""A last user message that asks for a summary of the conversation (Claude Code's compaction:
"Your task is to create a detailed summary of the conversation so far")."""
CONTINUED = re.compile(r"^\W*this session is being continued from a previous conversation", re.IGNORECASE)
"""A first user message that carries on from a compaction's summary (Claude Code's words)."""


@dataclass(frozen=True)
class Shape:
    """What a chat request looks like, for telling its edge."""

    system: str = ""
    """Its system prompt's text."""
    tools: bool = False
    """It lists tools."""
    first_user: str = ""
    """The text of its first user message."""
    last_user: str = ""
    """The text of its last message, if the user's."""

    @property
    def asks_for_summary(self) -> bool:
        return bool(SUMMARY_REQUEST.search(self.last_user))

    def continues_summary(self, summaries: Iterable[str]) -> bool:
        """Its first user message carries on from a compaction: in Claude Code's words, or by
        holding a recorded summary."""
        return bool(CONTINUED.search(self.first_user)) or any(s and s in self.first_user for s in summaries)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return ""


def shape(request: CanonicalRequest) -> Shape:
    """The shape of a canonical request; a completion has none to tell (an empty shape)."""
    if request.kind != "chat":
        return Shape()
    messages = request.context
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [m for m in messages if m.get("role") == "user"]
    last = messages[-1] if messages else {}
    return Shape(
        system=system,
        tools=bool(request.params.get("tools")),
        first_user=_text(users[0].get("content")) if users else "",
        last_user=_text(last.get("content")) if last.get("role") == "user" else "",
    )


def spawns(arguments: Sequence[Any]) -> list[str]:
    """The `prompt` arguments of an answer's tool calls (each call's arguments as the model wrote
    them): what a subagent it spawns begins with."""
    out = []
    for raw in arguments:
        prompt = arguments_object(raw).get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            out.append(prompt.replace("\r\n", "\n").strip())
    return out


def answer_text(answer: Any) -> str:
    """The text of a recorded answer (a canonical assistant message, or a completion's text)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, dict):
        return _text(answer.get("content"))
    return ""
