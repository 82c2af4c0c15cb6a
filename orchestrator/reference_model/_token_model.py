"""The reference model over tokens: its weights, the shape of its turns, where a token prefix
stands (`Context`: the conversation before the open turn, its tools and tool results), and the
normalisers that sampling and scoring share so that both get the same floats. Walking the grammar
from a context is `_decoding`'s."""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.reference_model._decoding import FREE, Constraint, Decoder
from orchestrator.reference_model._grammar import TOOL_NAME, CallGrammar, TrieCache, call_pattern
from orchestrator.reference_model._sampling import Normaliser, SamplingParams
from orchestrator.reference_model._vocabulary import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_OPEN,
    Vocabulary,
)
from orchestrator.reference_model._weights import CONTEXT_WINDOW, PolicyWeights

_EDGE = 1e-6
ASSISTANT_HEADER = "assistant\n"
TOOLS_OPEN, TOOLS_CLOSE = "\n<tools>", "\n</tools>"


@dataclass(frozen=True)
class Behaviour:
    """How the model's turns are shaped: part of the model, the same for every request."""

    mean_tool_turns: float = 5.0
    mean_answer_tokens: float = 24.0
    think_probability: float = 0.25
    mean_think_tokens: float = 16.0


def _clamped(p: float) -> float:
    return min(max(p, _EDGE), 1 - _EDGE)


def digest(token_ids: Sequence[int]) -> int:
    """A stable 64-bit digest of a token sequence."""
    data = array("I", token_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class TokenModel:
    """The model over tokens: weights, the shape of its turns, and its vocabulary's markers."""

    def __init__(self, weights: PolicyWeights, behaviour: Behaviour, tries: TrieCache) -> None:
        vocabulary: Vocabulary = weights.vocabulary
        self.weights = weights
        self.vocabulary = vocabulary
        self.behaviour = behaviour
        self._tries = tries
        ids = vocabulary.id_of
        self.im_start, self.im_end, self.end_of_text = ids(IM_START), ids(IM_END), ids(END_OF_TEXT)
        self.call_open, self.call_close = ids(TOOL_CALL_OPEN), ids(TOOL_CALL_CLOSE)
        self.response_open = ids(TOOL_RESPONSE_OPEN)
        self.think_open, self.think_close = ids(THINK_OPEN), ids(THINK_CLOSE)
        self.newline = vocabulary.newline_id
        self.blank_line = ids("\n\n")
        self.header = tuple(vocabulary.tokenize(ASSISTANT_HEADER))
        tokens = vocabulary.tokens
        self.generation_ids = vocabulary.generation_ids
        # Reasoning is one line: its own newline closes it, as the template writes it.
        self.think_ids = tuple(i for i in vocabulary.generation_ids if "\n" not in tokens[i])
        self.base_sets = {"gen": vocabulary.generation_set, "think": frozenset(self.think_ids)}
        self._tools: dict[int, tuple[tuple[str, str], ...]] = {}
        self._normalisers: dict[tuple[int, float, str], tuple[float, float]] = {}
        self._grammars: Callable[[tuple[tuple[str, str], ...]], CallGrammar | None] = lru_cache(maxsize=64)(
            self._grammar
        )

    # -- reading a prefix --------------------------------------------------------------------

    def context(self, prefix: Sequence[int]) -> Context:
        """Where a prefix stands: its anchor (the last `<|im_start|>`), whether an assistant turn
        is open there, and for one the tools and tool results of the conversation before it."""
        tokens = list(prefix)
        if self.im_start not in tokens:
            return Context(digest(()), False, None, 0, len(tokens))
        anchor = len(tokens) - 1 - tokens[::-1].index(self.im_start)
        head = digest(tokens[:anchor])
        start = anchor + 1 + len(self.header)
        if tuple(tokens[anchor + 1 : start]) != self.header:
            return Context(head, False, None, 0, len(tokens))
        grammar = self._grammars(self._system_tools(tokens))
        return Context(head, True, grammar, tokens[:anchor].count(self.response_open), start)

    def _system_tools(self, tokens: list[int]) -> tuple[tuple[str, str], ...]:
        """The tools the system turn at the start of the prefix lists: (name, JSON schema) pairs."""
        if not tokens or tokens[0] != self.im_start or self.im_end not in tokens:
            return ()
        block = tokens[1 : tokens.index(self.im_end)]
        key = digest(block)
        if key not in self._tools:
            if len(self._tools) >= 256:
                self._tools.clear()
            self._tools[key] = self._listed_tools(self.vocabulary.decode(block))
        return self._tools[key]

    @staticmethod
    def _listed_tools(text: str) -> tuple[tuple[str, str], ...]:
        start, end = text.find(TOOLS_OPEN), text.rfind(TOOLS_CLOSE)
        if not text.startswith("system\n") or start < 0 or end <= start:
            return ()
        tools = []
        for line in text[start + len(TOOLS_OPEN) : end].split("\n"):
            try:
                tool = json.loads(line)
            except ValueError:
                continue
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not TOOL_NAME.match(str(function.get("name", ""))):
                continue
            parameters = function.get("parameters")
            tools.append(
                (str(function["name"]), json.dumps(parameters if isinstance(parameters, dict) else {}))
            )
        return tuple(tools)

    def _grammar(self, tools: tuple[tuple[str, str], ...]) -> CallGrammar | None:
        if not tools:
            return None
        return CallGrammar([call_pattern(n, json.loads(s), self._tries) for n, s in tools], self.vocabulary)

    # -- steps ----------------------------------------------------------------------------------

    def decoder(self, prefix: Sequence[int], constraint: Constraint = FREE) -> Decoder:
        """A decoder standing after `prefix`: the part of its turn already in it is replayed."""
        context = self.context(prefix)
        decoder = Decoder(self, context, list(prefix[: context.start][-CONTEXT_WINDOW:]), constraint)
        for token_id in prefix[context.start :]:
            decoder.advance(token_id, strict=False)
        return decoder

    def normaliser(
        self,
        bucket: int,
        temperature: float,
        base: str,
        ids: Sequence[int],
        extra: Sequence[tuple[int, float]],
        logits: Sequence[float] | None = None,
    ) -> Normaliser:
        """The normaliser of a step whose support is `ids` (cached per bucket under the name
        `base`, if it has one; `logits` are theirs, if the caller has them) plus a few tokens with
        logits of their own. Sampling and scoring both come here, so they get the same floats."""
        inverse = 1.0 / temperature
        key = (bucket, temperature, base)
        cached = self._normalisers.get(key) if base else None
        if cached is None:
            logits = logits if logits is not None else self.weights.logits(bucket, ids)
            top = max(logits)
            cached = (top, math.fsum(math.exp((x - top) * inverse) for x in logits))
            if base and len(self._normalisers) < 1 << 16:
                self._normalisers[key] = cached
        top, total = cached
        high = max(top, *(x for _, x in extra)) if extra else top
        mass = total * math.exp((top - high) * inverse) + math.fsum(
            math.exp((x - high) * inverse) for _, x in extra
        )
        return Normaliser(high, inverse, math.log(mass))

    def calibrated(
        self, bucket: int, base: str, ids: Sequence[int], probabilities: Sequence[float]
    ) -> list[float]:
        """Logits that give extra tokens exactly these probabilities against the base support at
        temperature 1 (the base keeps what is left)."""
        whole = self.normaliser(bucket, 1.0, base, ids, ())
        base_lse = whole.top + whole.log_z
        rest = _clamped(1.0 - math.fsum(probabilities))
        return [math.log(_clamped(p)) - math.log(rest) + base_lse for p in probabilities]

    def logprobs(self, token_ids: Sequence[int], params: SamplingParams) -> list[float | None]:
        """A teacher-forced pass: the log-prob of each token given the tokens before it, under the
        distribution it would be sampled from (the first token has none)."""
        tokens = list(token_ids)
        out: list[float | None] = [None]
        decoder = self.decoder(tokens[:1])
        for i in range(1, len(tokens)):
            token_id = tokens[i]
            out.append(decoder.logprob(token_id, params))
            if token_id == self.im_start or tuple(tokens[i + 1 - len(self.header) : i + 1]) == self.header:
                decoder = self.decoder(tokens[: i + 1])
            else:
                decoder.advance(token_id, strict=False)
        return out


@dataclass(frozen=True)
class Context:
    """Where a prefix stands."""

    head: int
    """Digest of the tokens before the anchor (the last `<|im_start|>`): the conversation so far."""
    in_turn: bool
    """An assistant turn is open: the prefix reaches past `<|im_start|>assistant\\n`."""
    grammar: CallGrammar | None
    """The calls the conversation's tools allow; None without tools."""
    tool_results: int
    start: int
    """Where the open assistant turn begins (after its header); the prefix's end outside one."""
