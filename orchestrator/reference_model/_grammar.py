"""The tool-call grammar: a character automaton that token sampling is constrained to.

A call is the text ``\n{"name": "<tool>", "arguments": {<args>}}\n`` between the
``<tool_call>`` and ``</tool_call>`` tokens, as Qwen3's chat format writes it. Each tool contributes a
pattern: a sequence of parts, each a finite set of strings held in a trie.
Literal parts (keys, punctuation) have one string; value parts have the
JSON-encoded candidates from ``arguments``. A state is the set of live
(pattern, part, trie node) positions, so ambiguity between a value ending and
continuing (``1`` vs ``12``) is tracked exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.reference_model._arguments import argument_properties, value_candidates
from orchestrator.reference_model._vocabulary import Vocabulary

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""A tool name the model can call: what OpenAI's API allows."""
Position = tuple[int, int, int]
State = frozenset[Position]


class Trie:
    """An immutable character trie over a finite set of non-empty strings."""

    __slots__ = ("children", "terminal")

    def __init__(self, strings: Iterable[str]) -> None:
        children: list[dict[str, int]] = [{}]
        terminal = [False]
        for text in strings:
            if not text:
                raise ValueError("grammar strings must be non-empty")
            node = 0
            for ch in text:
                nxt = children[node].get(ch)
                if nxt is None:
                    nxt = len(children)
                    children[node][ch] = nxt
                    children.append({})
                    terminal.append(False)
                node = nxt
            terminal[node] = True
        self.children: tuple[dict[str, int], ...] = tuple(children)
        self.terminal: tuple[bool, ...] = tuple(terminal)


@dataclass(frozen=True)
class CallPattern:
    """One tool's calls: the tool name and the parts its call text is made of."""

    tool_name: str
    parts: tuple[Trie, ...]

    @property
    def prefix(self) -> str:
        """The call text before the arguments object, which the arguments string is cut after."""
        return call_prefix(self.tool_name)

    def arguments(self, call_text: str) -> str:
        """The arguments of a complete call text of this tool, verbatim."""
        return call_text[len(self.prefix) : -len(CALL_SUFFIX)]


CALL_SUFFIX = "}\n"
"""The call text after the arguments object."""


def call_prefix(tool_name: str) -> str:
    """The call text up to the arguments object."""
    return f'\n{{"name": {json.dumps(tool_name)}, "arguments": '


def call_text(tool_name: str, arguments: str) -> str:
    """The text between <tool_call> and </tool_call> for one call, arguments verbatim."""
    return call_prefix(tool_name) + arguments + CALL_SUFFIX


def call_pattern(tool_name: str, parameters: Mapping[str, Any], tries: TrieCache) -> CallPattern:
    """The pattern for one function tool, built from its JSON schema."""
    head = call_prefix(tool_name)
    properties = argument_properties(parameters)
    if not properties:
        return CallPattern(tool_name, (Trie([head + "{}" + CALL_SUFFIX]),))
    parts: list[Trie] = []
    literal = head + "{"
    for i, (name, schema) in enumerate(properties):
        literal += ("" if i == 0 else ", ") + json.dumps(name) + ": "
        parts.append(Trie([literal]))
        parts.append(tries.get(value_candidates(tool_name, name, schema)))
        literal = ""
    parts.append(Trie(["}" + CALL_SUFFIX]))
    return CallPattern(tool_name, tuple(parts))


class TrieCache:
    """Tries of value candidate sets, built once per distinct set (the shell set takes a few ms)."""

    def __init__(self) -> None:
        self._tries: dict[tuple[str, ...], Trie] = {}

    def get(self, strings: tuple[str, ...]) -> Trie:
        """The trie for these strings, reused when the same set was seen before."""
        trie = self._tries.get(strings)
        if trie is None:
            trie = Trie(strings)
            # Bounded: request-supplied enums could otherwise grow it without limit.
            if len(self._tries) < 1024:
                self._tries[strings] = trie
        return trie


class CallGrammar:
    """The union of the offered tools' call patterns, stepped one token at a time."""

    def __init__(self, patterns: Sequence[CallPattern], vocabulary: Vocabulary) -> None:
        self.patterns = tuple(patterns)
        self._vocabulary = vocabulary

    def start(self) -> State:
        """The state before the first character of a call."""
        return self._closure((p, 0, 0) for p in range(len(self.patterns)))

    def _closure(self, positions: Iterable[Position]) -> State:
        out = set(positions)
        stack = list(out)
        while stack:
            p, k, node = stack.pop()
            parts = self.patterns[p].parts
            if parts[k].terminal[node] and k + 1 < len(parts):
                nxt = (p, k + 1, 0)
                if nxt not in out:
                    out.add(nxt)
                    stack.append(nxt)
        return frozenset(out)

    def advance(self, state: State, text: str) -> State:
        """The state after consuming text; empty if the text leaves the grammar."""
        for ch in text:
            moved = []
            for p, k, node in state:
                child = self.patterns[p].parts[k].children[node].get(ch)
                if child is not None:
                    moved.append((p, k, child))
            if not moved:
                return frozenset()
            state = self._closure(moved)
        return state

    def accepting(self, state: State) -> bool:
        """Whether the call text read so far is a complete call."""
        for p, k, node in state:
            parts = self.patterns[p].parts
            if k == len(parts) - 1 and parts[k].terminal[node]:
                return True
        return False

    def allowed(self, state: State) -> dict[int, State]:
        """Every generation token that keeps the call text inside the grammar, with the state it leads to."""
        next_chars: set[str] = set()
        for p, k, node in state:
            next_chars.update(self.patterns[p].parts[k].children[node])
        out: dict[int, State] = {}
        tokens = self._vocabulary.tokens
        for ch in next_chars:
            for token_id in self._vocabulary.ids_by_first_char.get(ch, ()):
                nxt = self.advance(state, tokens[token_id])
                if nxt:
                    out[token_id] = nxt
        return out

    def pattern_of(self, call_text: str) -> CallPattern:
        """The pattern a complete call text belongs to."""
        for pattern in self.patterns:
            if call_text.startswith(pattern.prefix):
                return pattern
        raise ValueError(f"not a call of any offered tool: {call_text[:80]!r}")
