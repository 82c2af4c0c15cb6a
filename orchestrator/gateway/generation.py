"""One upstream generation, accumulated from a chat or legacy completion response, whole or
streamed: the text, the tool calls, and the token ids and behaviour log-probs, never re-tokenised."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.trajectory.canonical import arguments_object, canonical_message


class UpstreamFault(Exception):
    """The model server answered with something that is not a usable generation."""


def check_sampled(finish_reason: str, token_ids: list[int], logprobs: list[float]) -> None:
    """Refuse a generation that ended early or lacks a log-prob per sampled token: the ledger
    records both exactly or not at all."""
    if not finish_reason:
        raise UpstreamFault("the model server's answer ended before its finish reason")
    if not token_ids or len(token_ids) != len(logprobs):
        raise UpstreamFault(
            f"the model server returned {len(token_ids)} token ids and {len(logprobs)} log-probs; "
            "Stasis records both per token (vLLM: return_token_ids)"
        )


@dataclass
class ToolCall:
    id: str
    name: str = ""
    arguments: str = ""
    """The arguments exactly as the model produced them (normally a JSON object)."""

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as an object; anything else is wrapped so a harness always gets one."""
        return arguments_object(self.arguments)


@dataclass
class Generation:
    kind: str
    """chat | completion: the kind of request it answers."""
    mode: str = "text"
    """text: the upstream's own chat or completion answer; tokens: sampled ids the gateway parsed."""
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    response_id: str = ""
    created: int = 0
    policy_version: str = ""
    token_texts: list[str] = field(default_factory=list)
    """Token mode: each sampled token's own text, for a harness that asks for log-probs."""

    # -- reading ---------------------------------------------------------------------------

    def add(self, data: dict[str, Any]) -> None:
        """Fold in one streamed chunk, or a whole response."""
        self.model = self.model or str(data.get("model") or "")
        self.response_id = self.response_id or str(data.get("id") or "")
        self.created = self.created or int(data.get("created") or 0)
        if data.get("prompt_token_ids"):
            self.prompt_token_ids = [int(t) for t in data["prompt_token_ids"]]
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                raise UpstreamFault("the model server returned more than one choice")
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        if self.kind == "chat":
            part = choice.get("delta") or choice.get("message") or {}
            self.text += part.get("content") or ""
            self.reasoning += part.get("reasoning_content") or part.get("reasoning") or ""
            for i, call in enumerate(part.get("tool_calls") or []):
                self._tool_call(int(call.get("index", i)), call)
            entries = (choice.get("logprobs") or {}).get("content") or []
            self.logprobs += [float(e["logprob"]) for e in entries]
            labels = [str(e.get("token", "")) for e in entries]
        else:
            self.text += choice.get("text") or ""
            lp = choice.get("logprobs") or {}
            self.logprobs += [float(x) for x in lp.get("token_logprobs") or []]
            labels = [str(t) for t in lp.get("tokens") or []]
            if choice.get("prompt_token_ids"):
                self.prompt_token_ids = [int(t) for t in choice["prompt_token_ids"]]
        ids = choice.get("token_ids")
        if ids is None and labels and all(t.startswith("token_id:") for t in labels):
            ids = [t.split(":", 1)[1] for t in labels]  # vLLM's return_tokens_as_token_ids
        self.token_ids += [int(t) for t in ids or []]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def _tool_call(self, index: int, call: dict[str, Any]) -> None:
        while len(self.tool_calls) <= index:
            self.tool_calls.append(ToolCall(id=""))
        target = self.tool_calls[index]
        target.id = target.id or str(call.get("id") or "")
        function = call.get("function") or {}
        target.name += function.get("name") or ""
        target.arguments += function.get("arguments") or ""

    @classmethod
    def from_tokens(
        cls,
        kind: str,
        prompt_ids: list[int],
        token_ids: list[int],
        logprobs: list[float],
        finish_reason: str,
        **what: Any,
    ) -> Generation:
        """A generation sampled as token ids, with what the model's parser read from them
        (`text`, `reasoning`, `tool_calls`, `model`, `response_id`)."""
        g = cls(kind, "tokens", token_ids=token_ids, logprobs=logprobs, prompt_token_ids=prompt_ids, **what)
        g.finish_reason = "tool_calls" if g.tool_calls and finish_reason == "stop" else finish_reason
        g.prompt_tokens, g.completion_tokens = len(prompt_ids), len(token_ids)
        g.created = g.created or int(time.time())
        return g

    def check(self) -> None:
        """Refuse a generation the ledger cannot record exactly."""
        check_sampled(self.finish_reason, self.token_ids, self.logprobs)
        for call in self.tool_calls:
            if not call.name:
                raise UpstreamFault("the model server returned a tool call without a name")

    # -- what it says ----------------------------------------------------------------------

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens or len(self.token_ids)

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens or len(self.prompt_token_ids)

    def answer(self) -> Any:
        """What the ledger matches the next request against: the canonical chat message (in the
        call ids the harness sees), or a completion's text."""
        return canonical_message(self.message()) if self.kind == "chat" else self.text

    def message(self) -> dict[str, Any]:
        """The answer as an OpenAI chat message."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message
