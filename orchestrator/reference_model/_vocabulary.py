"""The reference model's fixed vocabulary and its greedy longest-match tokenizer.

Token id = index into ``TOKENS``. The order is part of the contract (recorded
token ids must mean the same thing on every run) so only ever append.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

CHARACTER_TOKENS = ("\t", "\n", *(chr(c) for c in range(32, 127)))

# Multi-character fragments: the chat template, JSON punctuation, the shell and
# file vocabulary of the tool-call grammar, and common English words for answers.
# fmt: off
FRAGMENT_TOKENS = (
    # chat template and tool listing
    "system", "user", "assistant", "tool", "# Tools", "\n\n", "You may call", " these", " functions",
    # JSON punctuation and keys
    '{"', '"}', '": "', '", "', '": ', ', "', '["', '"]', "{}", "[]", "}}", '"}}', "\\n", '\\"', "\\\\",
    '{"name": "', '", "arguments": ', '"name"', '"arguments"', '"type"', '"string"', '"object"',
    '"properties"', '"required"', '"description"', '"parameters"', "name", "arguments", "type", "string",
    "object", "properties", "required", "description", "parameters", "function", "true", "false", "null",
    "integer", "number", "boolean", "array", "items", "enum",
    # tool names and parameters
    "shell", "write_file", "read_file", "write", "_file", "command", "path", "content", "file",
    # shell snippets
    "echo", "ls", "cat", "python3", "mkdir", "wc", "head", "tail", "grep", "touch", "sort", "uniq", "pwd",
    " -la", " -l", " -p", " -n", " -c", " -s", " >>", " >", " |", " &&", " '", "'", "print(", "')", "))",
    ")'", "sum(", "range(", "len(", "str(", "upper()", "'.join(", "import", " os", "os.", "listdir(",
    ".txt", ".md", ".py", ".json", ".log", ".csv", "notes", " notes", "log", " log", "progress", "todo",
    "README", "results", "summary", "src", "main", "hello", " hello", "world", " world", "step", "_", "out",
    "tmp", "docs", "result", "plan", "data", "report",
    # words for answers
    " the", " a", " an", " to", " of", " and", " in", " is", " it", " that", " for", " on", " with", " as",
    " this", " be", " are", " was", " I", " you", " we", " have", " has", " will", " can", " not", " all",
    " file", " files", " task", " step", " steps", " done", " result", " results", " output", " created",
    " wrote", " written", " ran", " run", " command", " commands", " directory", " list", " complete",
    " completed", " finished", " now", " then", " next", " first", " last", " each", " line", " lines",
    " number", " total", " value", " answer", " final", " summary", " work", " working", " check",
    " checked", " contains", " here", " there", " so", " do", " did", " no", " yes", " one", " two",
    " three", " four", " five", " more", " from", " by", " at", " or", " if", " what", " which", " they",
    " their", " its", " my", " me", " our", " should", " would", " could", " may", " also", " only",
    " just", " like", " new", " after", " before", " again", " still", " found", " looks", " good",
    " correct", " expected", " everything", " nothing", " some", " any", " every", " other", " into",
    " about", " over", " out", " up", " down", " used", " using", " make", " made", " see", " saw",
    " shows", " printed", " prints", " returned", " count", " counted", " notes.txt", " verified",
    " updated", " added", " appended", " wrote", " read", " test", " tests", " passed", " failed", " error",
    " errors", " ok", " OK", " current", " state", " progress", "The", "I", "We", "Done", "All", "This",
    "Here", "Task", "Result", "Next", "Finally", "First", "Now", "It", "Summary", "OK", "Yes", "No",
    # punctuation runs
    ". ", ".\n", ", ", ": ", "...", " -", "  ", "    ", " (", ").", "),", "!\n", "\n- ", "- ", "**",
)
# fmt: on

BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


class _TrieNode:
    __slots__ = ("children", "token_id")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.token_id = -1


def _build_trie(ids: Mapping[str, int]) -> _TrieNode:
    root = _TrieNode()
    for text, token_id in ids.items():
        node = root
        for ch in text:
            node = node.children.setdefault(ch, _TrieNode())
        node.token_id = token_id
    return root


class Vocabulary:
    """Token strings and their bytes, the text-token trie and the generation alphabet."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens: tuple[str, ...] = tuple(tokens)
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("vocabulary has duplicate tokens")
        self.byte_base = self.tokens.index(BYTE_TOKENS[0])
        self.token_bytes: tuple[bytes, ...] = tuple(
            bytes([i - self.byte_base]) if i >= self.byte_base else t.encode()
            for i, t in enumerate(self.tokens)
        )
        special = {self.tokens.index(s) for s in SPECIAL_TOKENS}
        self.special_ids: frozenset[int] = frozenset(special)
        text_ids = {t: i for i, t in enumerate(self.tokens) if i not in special and i < self.byte_base}
        self.text_ids: Mapping[str, int] = MappingProxyType(text_ids)
        # The generation alphabet: what free text and tool-call JSON are sampled from.
        self.generation_ids: tuple[int, ...] = tuple(sorted(text_ids.values()))
        self.generation_set: frozenset[int] = frozenset(self.generation_ids)
        by_first: dict[str, list[int]] = {}
        for text, token_id in text_ids.items():
            by_first.setdefault(text[0], []).append(token_id)
        self.ids_by_first_char: Mapping[str, tuple[int, ...]] = MappingProxyType(
            {ch: tuple(sorted(ids)) for ch, ids in by_first.items()}
        )
        self._trie = _build_trie(text_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        """The id of a special or text token given by its exact string."""
        if token in self.text_ids:
            return self.text_ids[token]
        return self.tokens.index(token)

    def tokenize(self, text: str) -> list[int]:
        """Greedy longest match over text tokens; characters outside them fall back to UTF-8 byte tokens."""
        out: list[int] = []
        i, n = 0, len(text)
        root = self._trie
        while i < n:
            node: _TrieNode | None = root
            best, best_end, j = -1, i, i
            while j < n and node is not None:
                node = node.children.get(text[j])
                j += 1
                if node is not None and node.token_id >= 0:
                    best, best_end = node.token_id, j
            if best < 0:
                out.extend(self.byte_base + b for b in text[i].encode())
                i += 1
            else:
                out.append(best)
                i = best_end
        return out

    def decode(self, token_ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Concatenate the tokens' bytes and decode them as UTF-8 (invalid sequences become U+FFFD)."""
        parts = (self.token_bytes[t] for t in token_ids if not (skip_special and t in self.special_ids))
        return b"".join(parts).decode("utf-8", errors="replace")


def standard_tokens() -> tuple[str, ...]:
    """The documented token list: specials, characters, fragments, byte fallbacks, in id order."""
    fragments = tuple(dict.fromkeys(f for f in FRAGMENT_TOKENS if f not in CHARACTER_TOKENS))
    return (*SPECIAL_TOKENS, *CHARACTER_TOKENS, *fragments, *BYTE_TOKENS)


# An immutable constant shared by every model instance; nothing ever mutates it.
VOCABULARY = Vocabulary(standard_tokens())


def tokenize(text: str) -> list[int]:
    """Tokenize text with the standard vocabulary."""
    return VOCABULARY.tokenize(text)


def decode(token_ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Decode token ids with the standard vocabulary."""
    return VOCABULARY.decode(token_ids, skip_special=skip_special)
