"""The reference model's fixed vocabulary and its tokenizer, shipped as a Hugging Face
`tokenizer.json` (in `tokenizer/`, beside the chat template) that any stock tool loads.

Token id = index into `standard_tokens()`: the specials Qwen3's chat format uses, single
characters, fragments, then one byte-fallback token per byte value. The tokenizer is a Unigram
model with byte fallback in which every token scores alike, so it picks the fewest tokens that
spell a text; characters with no token of their own become their UTF-8 bytes. The model and the
gateway both tokenise through that file, so they always agree; the checked-in file is what
`build_tokenizer()` makes (a test holds them equal).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

from tokenizers import AddedToken, Tokenizer, decoders, models

TOKENIZER_DIR = Path(__file__).with_name("tokenizer")
"""The reference model's tokenizer directory: `tokenizer.json`, `tokenizer_config.json` and
`chat_template.jinja`, in Hugging Face's layout."""

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
UNKNOWN = "<unk>"
CONTROL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
"""Special tokens proper: decoding with `skip_special` leaves them out, as servers do for text."""
MARKUP_TOKENS = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    THINK_OPEN,
    THINK_CLOSE,
)
"""Tokens of their own that stay in decoded text, as in Qwen3's tokenizer."""
SPECIAL_TOKENS = (*CONTROL_TOKENS, *MARKUP_TOKENS, UNKNOWN)

CHARACTER_TOKENS = ("\t", "\n", *(chr(c) for c in range(32, 127)))

# Multi-character fragments: the chat template, JSON punctuation, the shell and
# file vocabulary of the tool-call grammar, and common English words for answers.
# fmt: off
FRAGMENT_TOKENS = (
    # chat template and tool listing
    "system", "user", "assistant", "tool", "# Tools", "\n\n", "You may call", " these", " functions",
    " one", " more", " function", " call", " assist", " user", " query", " provided", " signatures",
    " within", "<tools>", "</tools>", " XML", " tags", "For", " return", " json", " object", " arguments",
    '{"type": "function", "function": {"name": "', '", "description": "', '", "parameters": {',
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


def standard_tokens() -> tuple[str, ...]:
    """The token list: specials, characters, fragments, byte fallbacks, in id order."""
    fragments = tuple(dict.fromkeys(f for f in FRAGMENT_TOKENS if f not in CHARACTER_TOKENS))
    return (*SPECIAL_TOKENS, *CHARACTER_TOKENS, *fragments, *BYTE_TOKENS)


def build_tokenizer(tokens: Sequence[str] | None = None) -> Tokenizer:
    """The Hugging Face tokenizer of a token list (the standard one by default)."""
    tokens = tuple(tokens or standard_tokens())
    special = set(SPECIAL_TOKENS)
    # Every piece scores alike: the Viterbi path is the one with the fewest tokens.
    model = models.Unigram(
        [(t, 0.0 if t in special else -1.0) for t in tokens], unk_id=tokens.index(UNKNOWN), byte_fallback=True
    )
    tokenizer = Tokenizer(model)
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (*CONTROL_TOKENS, UNKNOWN)]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


class Vocabulary:
    """Token strings and their bytes, the tokenizer, and the generation alphabet."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        tokens = [tokenizer.id_to_token(i) for i in range(size)]
        if any(t is None for t in tokens) or len(set(tokens)) != size:
            raise ValueError("the tokenizer's ids must run from 0 without gaps or duplicates")
        self.tokens: tuple[str, ...] = tuple(t for t in tokens if t is not None)
        self._tokenizer = tokenizer
        self.byte_base = self.tokens.index(BYTE_TOKENS[0])
        self.token_bytes: tuple[bytes, ...] = tuple(
            bytes([i - self.byte_base]) if i >= self.byte_base else t.encode()
            for i, t in enumerate(self.tokens)
        )
        self.special_ids: frozenset[int] = frozenset(self.tokens.index(s) for s in (*CONTROL_TOKENS, UNKNOWN))
        self.markup_ids: frozenset[int] = frozenset(self.tokens.index(s) for s in MARKUP_TOKENS)
        reserved = self.special_ids | self.markup_ids
        text_ids = {t: i for i, t in enumerate(self.tokens) if i not in reserved and i < self.byte_base}
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

    @classmethod
    def load(cls, directory: Path = TOKENIZER_DIR) -> Vocabulary:
        """The vocabulary of a tokenizer directory's `tokenizer.json`."""
        return cls(Tokenizer.from_file(str(directory / "tokenizer.json")))

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        """The id of a special or text token given by its exact string."""
        if token in self.text_ids:
            return self.text_ids[token]
        return self.tokens.index(token)

    @cached_property
    def newline_id(self) -> int:
        return self.id_of("\n")

    def tokenize(self, text: str) -> list[int]:
        """Token ids of text; specials spelled in it become those tokens, as in any Hugging Face
        tokenizer."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else []

    def decode(self, token_ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Concatenate the tokens' bytes and decode them as UTF-8 (invalid sequences become U+FFFD)."""
        parts = (self.token_bytes[t] for t in token_ids if not (skip_special and t in self.special_ids))
        return b"".join(parts).decode("utf-8", errors="replace")


def tokenizer_config() -> dict[str, object]:
    """`tokenizer_config.json` of the tokenizer directory, in Hugging Face's shape."""
    tokens = standard_tokens()
    added = {
        str(tokens.index(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t not in MARKUP_TOKENS,
        }
        for t in SPECIAL_TOKENS
    }  # fmt: skip
    return {
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": UNKNOWN,
        "model_max_length": 1 << 20,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def write_tokenizer_dir(directory: Path) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` (the chat template is a file of its own)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(build_tokenizer().to_str(pretty=True) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")


# An immutable constant shared by every model instance; nothing ever mutates it.
VOCABULARY = Vocabulary.load()


def tokenize(text: str) -> list[int]:
    """Tokenize text with the standard vocabulary."""
    return VOCABULARY.tokenize(text)


def decode(token_ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Decode token ids with the standard vocabulary."""
    return VOCABULARY.decode(token_ids, skip_special=skip_special)
