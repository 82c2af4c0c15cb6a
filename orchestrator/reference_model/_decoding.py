"""The reference model as a language model over tokens: the next-token distribution is a function
of the token prefix, the policy version and the sampling parameters alone.

A prefix is read for where it stands (`Context.of`). After `<|im_start|>assistant\\n` it is inside
an assistant turn, whose grammar is Qwen3's: optional reasoning (`<think>\\n…\\n</think>\\n\\n`),
then an answer (free text, then `<|im_end|>`) or one or more tool calls (`<tool_call>` call JSON
`</tool_call>`, separated by a newline, then `<|im_end|>`). The tools a call may name are read from
the tool listing in the prompt's system turn, and the answer-or-call odds from the tool results
in it. Anywhere else the text is free, ended by `<|endoftext|>`.

At every step the grammar decides which tokens are allowed; the distribution is the softmax of
their logits at the request's temperature, optionally cut to the top-p nucleus, and renormalised
over what is left. A sampled token's log-prob is its log-prob under exactly that distribution, and
`TokenModel.logprobs` (a teacher-forced pass) computes the very same floats.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import heapq
import itertools
import json
import math
import random
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from orchestrator.reference_model._grammar import TOOL_NAME, CallGrammar, State, TrieCache, call_pattern
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

CANONICAL_PENALTY = 8.0
"""Nats taken off a call-grammar token when a longer allowed token extends it, so calls are
tokenized canonically (as a trained model would) while real choices stay open."""
ANSWER_SLOPE = 1.5
"""Steepness of the answer-vs-call hazard around the mean number of tool turns."""
PARALLEL_CALL_PROBABILITY = 0.1
"""Chance (at temperature 1) of a further call in the same response after a complete call."""
_EDGE = 1e-6
ASSISTANT_HEADER = "assistant\n"
TOOLS_OPEN, TOOLS_CLOSE = "\n<tools>", "\n</tools>"


class Phase(enum.Enum):
    """Where in the grammar the next token falls."""

    TEXT = "text"
    """Outside an assistant turn (or after its end): free text."""
    START = "start"
    THINK_OPEN = "think_open"
    THINK = "think"
    THINK_CLOSE = "think_close"
    AFTER_THINK = "after_think"
    ANSWER_START = "answer_start"
    """After reasoning: an answer or a call, no second reasoning."""
    ANSWER = "answer"
    CALL = "call"
    AFTER_CALL = "after_call"
    NEXT_CALL = "next_call"
    DONE = "done"


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling settings."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Behaviour:
    """How the model's turns are shaped: part of the model, the same for every request."""

    mean_tool_turns: float = 5.0
    mean_answer_tokens: float = 24.0
    think_probability: float = 0.25
    mean_think_tokens: float = 16.0


@dataclass(frozen=True)
class Constraint:
    """What a chat request's `tool_choice` and `parallel_tool_calls` add, as guided decoding does
    on a model server: a mask on the distribution, outside the tokens."""

    tools: frozenset[str] | None = None
    """The tools a call may name; None: every tool the prompt lists."""
    require_call: bool = False
    forbid_calls: bool = False
    parallel_calls: bool = True


FREE = Constraint()


@dataclass(frozen=True)
class StepDistribution:
    """The distribution one token was (or would be) sampled from: its support and log-probs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def logprob(self, token_id: int) -> float:
        """The log-prob of token_id; -inf outside the support."""
        try:
            return self.logprobs[self.token_ids.index(token_id)]
        except ValueError:
            return -math.inf

    def top(self, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens, most likely first (ties broken by lower id)."""
        # nlargest is stable, and the support is in id order, so ties go to the lower id.
        best = heapq.nlargest(k, range(len(self.logprobs)), key=self.logprobs.__getitem__)
        return [(self.token_ids[i], self.logprobs[i]) for i in best]

    def sample(self, u: float) -> int:
        """The token at uniform variate u in [0, 1) by inverse CDF over the support in id order."""
        cumulative = list(itertools.accumulate(map(math.exp, self.logprobs)))
        # Float rounding can leave the total a hair under 1; u beyond it takes the last token.
        return self.token_ids[min(bisect.bisect_right(cumulative, u), len(cumulative) - 1)]


@dataclass(frozen=True)
class SampledToken:
    """One generated token with its log-prob and the top alternatives of its distribution."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Generation:
    """The generated tokens and why generation stopped."""

    tokens: list[SampledToken]
    finish_reason: str
    stop_at: int | None = None
    """Character offset where a stop string cut the answer text, if one did."""

    @property
    def token_ids(self) -> list[int]:
        """The generated token ids in order."""
        return [t.token_id for t in self.tokens]


def sigmoid(x: float) -> float:
    """The logistic function."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def answer_probability(tool_results: int, mean_tool_turns: float) -> float:
    """P(answer rather than call) at temperature 1, rising with the tool results already seen."""
    return sigmoid(ANSWER_SLOPE * (tool_results - mean_tool_turns))


def end_probability(tokens: int, mean_tokens: float) -> float:
    """P(end now) at temperature 1 after `tokens` tokens of an answer or of reasoning."""
    scale = max(1.0, mean_tokens / 8)
    return sigmoid((tokens - mean_tokens) / scale)


def _clamped(p: float) -> float:
    return min(max(p, _EDGE), 1 - _EDGE)


def digest(token_ids: Sequence[int]) -> int:
    """A stable 64-bit digest of a token sequence."""
    data = array("I", token_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class _Normaliser:
    """What turns logits into log-probs at one step: lp(x) = (x - top) * inverse - log_z."""

    top: float
    inverse: float
    log_z: float

    def __call__(self, logit: float) -> float:
        return (logit - self.top) * self.inverse - self.log_z


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
    ) -> _Normaliser:
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
        return _Normaliser(high, inverse, math.log(mass))

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


@dataclass(frozen=True)
class _Step:
    """One step's support: a forced token, or base ids (one cached set) plus extra tokens, or an
    explicit list of (id, logit) pairs."""

    forced: int | None = None
    base: str = ""
    ids: Sequence[int] = ()
    extra: tuple[tuple[int, float], ...] = ()
    explicit: tuple[tuple[int, float], ...] = ()


class Decoder:
    """Walks the grammar from a context; gives each step's distribution and takes its token."""

    def __init__(self, model: TokenModel, context: Context, last: list[int], constraint: Constraint) -> None:
        self.model = model
        self.context = context
        self.constraint = constraint
        self._last = last
        self.phase = Phase.START if context.in_turn else Phase.TEXT
        self._call_state: State = frozenset()
        self._count = 0
        self.calls = 0

    @property
    def _bucket(self) -> int:
        return self.model.weights.context_key(self.context.head, self._last)

    def _step(self) -> _Step:
        m, phase, bucket = self.model, self.phase, self._bucket
        shape = m.behaviour
        gen = m.generation_ids
        if phase in (Phase.TEXT, Phase.DONE):
            [end] = m.calibrated(bucket, "gen", gen, [1.0 / shape.mean_answer_tokens])
            return _Step(base="gen", ids=gen, extra=((m.end_of_text, end),))
        if phase in (Phase.START, Phase.ANSWER_START):
            grammar = self.context.grammar
            calls = grammar is not None and not self.constraint.forbid_calls
            if calls and self.constraint.require_call:
                return _Step(forced=m.call_open)
            p_think = shape.think_probability if phase is Phase.START else 0.0
            p_call = (
                1.0 - answer_probability(self.context.tool_results, shape.mean_tool_turns) if calls else 0.0
            )
            extra = [(m.think_open, p_think), (m.call_open, (1.0 - p_think) * p_call)]
            extra = [(t, p) for t, p in extra if p > 0]
            logits = m.calibrated(bucket, "gen", gen, [p for _, p in extra])
            return _Step(base="gen", ids=gen, extra=tuple(zip([t for t, _ in extra], logits, strict=True)))
        if phase is Phase.THINK_OPEN:
            return _Step(forced=m.newline)
        if phase is Phase.THINK:
            [close] = m.calibrated(
                bucket, "think", m.think_ids, [end_probability(self._count, shape.mean_think_tokens)]
            )
            return _Step(base="think", ids=m.think_ids, extra=((m.newline, close),))
        if phase is Phase.THINK_CLOSE:
            return _Step(forced=m.think_close)
        if phase is Phase.AFTER_THINK:
            return _Step(forced=m.blank_line)
        if phase is Phase.ANSWER:
            [end] = m.calibrated(bucket, "gen", gen, [end_probability(self._count, shape.mean_answer_tokens)])
            return _Step(base="gen", ids=gen, extra=((m.im_end, end),))
        if phase is Phase.CALL:
            return _Step(explicit=self._call_support(bucket))
        if phase is Phase.AFTER_CALL:
            if not self.constraint.parallel_calls:
                return _Step(forced=m.im_end)
            end = m.weights.logit(bucket, m.im_end)
            more = math.log(PARALLEL_CALL_PROBABILITY) - math.log1p(-PARALLEL_CALL_PROBABILITY) + end
            return _Step(explicit=tuple(sorted([(m.im_end, end), (m.newline, more)])))
        if phase is Phase.NEXT_CALL:
            return _Step(forced=m.call_open)
        raise AssertionError(phase)

    def _call_support(self, bucket: int) -> tuple[tuple[int, float], ...]:
        grammar = self.context.grammar
        assert grammar is not None
        m = self.model
        allowed = sorted(self._allowed())
        logits = m.weights.logits(bucket, allowed)
        tokens = m.vocabulary.tokens
        by_text = sorted(range(len(allowed)), key=lambda i: tokens[allowed[i]])
        for pos, i in enumerate(by_text[:-1]):
            if tokens[allowed[by_text[pos + 1]]].startswith(tokens[allowed[i]]):
                logits[i] -= CANONICAL_PENALTY
        support = list(zip(allowed, logits, strict=True))
        if grammar.accepting(self._call_state):
            support.insert(0, (m.call_close, m.weights.logit(bucket, m.call_close)))
        if not support:
            raise ValueError("the call grammar allows no continuation")
        return tuple(support)

    def _allowed(self) -> dict[int, State]:
        grammar = self.context.grammar
        assert grammar is not None
        allowed = grammar.allowed(self._call_state)
        names = self.constraint.tools
        if names is None or self._call_state != grammar.start():
            return allowed
        # A named tool: the call's first token must keep a pattern of that tool alive.
        return {
            t: s for t, s in allowed.items() if any(grammar.patterns[p].tool_name in names for p, _, _ in s)
        }

    def distribution(self, params: SamplingParams) -> StepDistribution:
        """The distribution of the next token."""
        step = self._step()
        if step.forced is not None:
            return StepDistribution((step.forced,), (0.0,))
        norm: _Normaliser | None = None
        if step.explicit:
            ids = [t for t, _ in step.explicit]
            logits = [x for _, x in step.explicit]
            if params.temperature:
                norm = _explicit_normaliser(logits, params.temperature)
        else:
            bucket = self._bucket
            base_logits = self.model.weights.logits(bucket, step.ids)
            extra = sorted(step.extra)
            if not extra or extra[-1][0] < step.ids[0]:
                ids = [t for t, _ in extra] + list(step.ids)
                logits = [x for _, x in extra] + base_logits
            else:
                merged = sorted([*extra, *zip(step.ids, base_logits, strict=True)])
                ids, logits = [t for t, _ in merged], [x for _, x in merged]
            if params.temperature:
                norm = self.model.normaliser(
                    bucket, params.temperature, step.base, step.ids, step.extra, base_logits
                )
        if norm is None:  # temperature 0: greedy, ties to the lower id
            best = max(range(len(ids)), key=lambda i: (logits[i], -ids[i]))
            return StepDistribution((ids[best],), (0.0,))
        top, inverse, log_z = norm.top, norm.inverse, norm.log_z
        # _Normaliser.__call__'s arithmetic, inlined: the same floats.
        dist = StepDistribution(tuple(ids), tuple((x - top) * inverse - log_z for x in logits))
        return _nucleus(dist, params.top_p) if params.top_p < 1.0 else dist

    def logprob(self, token_id: int, params: SamplingParams) -> float:
        """The log-prob of token_id as the next token: `distribution(params).logprob(token_id)`,
        without building the whole distribution where it need not be."""
        step = self._step()
        if step.forced is not None:
            return 0.0 if token_id == step.forced else -math.inf
        if step.explicit or not params.temperature or params.top_p < 1.0:
            return self.distribution(params).logprob(token_id)
        extra = dict(step.extra)
        if token_id in extra:
            logit = extra[token_id]
        elif token_id in self.model.base_sets[step.base]:
            logit = self.model.weights.logit(self._bucket, token_id)
        else:
            return -math.inf
        return self.model.normaliser(self._bucket, params.temperature, step.base, step.ids, step.extra)(logit)

    def advance(self, token_id: int, *, strict: bool = True) -> None:
        """Take token_id as the next token. Strict: it must be in the current support; otherwise
        (replaying a prompt, scoring context) the grammar follows as best it can."""
        m, phase = self.model, self.phase
        nxt = self._next(token_id)
        if nxt is None:
            if strict:
                raise ValueError(f"token {token_id} is not allowed in phase {phase.value}")
            nxt = (
                Phase.AFTER_THINK
                if token_id == m.think_close
                else (Phase.THINK if phase in (Phase.THINK_OPEN, Phase.THINK_CLOSE) else Phase.DONE)
            )
        if nxt is Phase.CALL and phase is not Phase.CALL:
            assert self.context.grammar is not None
            self._call_state = self.context.grammar.start()
        if nxt is not phase:
            self._count = 0
        if nxt in (Phase.ANSWER, Phase.THINK) and not (phase is Phase.THINK_OPEN and nxt is Phase.THINK):
            self._count += 1
        self.phase = nxt
        self._last = [*self._last, token_id][-CONTEXT_WINDOW:]

    def _next(self, token_id: int) -> Phase | None:
        """The phase after token_id, or None if the grammar does not allow it here."""
        m, phase = self.model, self.phase
        grammar = self.context.grammar
        text = token_id in m.vocabulary.generation_set
        if phase in (Phase.TEXT, Phase.DONE):
            return Phase.DONE if token_id == m.end_of_text else (phase if text else None)
        if phase in (Phase.START, Phase.ANSWER_START):
            if token_id == m.think_open and phase is Phase.START:
                return Phase.THINK_OPEN
            if token_id == m.call_open and grammar is not None:
                return Phase.CALL
            return Phase.ANSWER if text else None
        if phase is Phase.THINK_OPEN:
            return Phase.THINK if token_id == m.newline else None
        if phase is Phase.THINK:
            if token_id == m.newline:
                return Phase.THINK_CLOSE
            return Phase.THINK if token_id in m.think_ids else None
        if phase is Phase.THINK_CLOSE:
            return Phase.AFTER_THINK if token_id == m.think_close else None
        if phase is Phase.AFTER_THINK:
            return Phase.ANSWER_START if token_id == m.blank_line else None
        if phase is Phase.ANSWER:
            return Phase.DONE if token_id == m.im_end else (Phase.ANSWER if text else None)
        if phase is Phase.CALL:
            assert grammar is not None
            if token_id == m.call_close and grammar.accepting(self._call_state):
                self.calls += 1
                return Phase.AFTER_CALL
            state = grammar.advance(self._call_state, m.vocabulary.tokens[token_id]) if text else frozenset()
            if not state:
                return None
            self._call_state = state
            return Phase.CALL
        if phase is Phase.AFTER_CALL:
            if token_id == m.im_end:
                return Phase.DONE
            return Phase.NEXT_CALL if token_id == m.newline else None
        if phase is Phase.NEXT_CALL:
            return Phase.CALL if token_id == m.call_open else None
        raise AssertionError(phase)


def _explicit_normaliser(logits: Sequence[float], temperature: float) -> _Normaliser:
    inverse = 1.0 / temperature
    top = max(logits)
    return _Normaliser(top, inverse, math.log(math.fsum(math.exp((x - top) * inverse) for x in logits)))


def _nucleus(dist: StepDistribution, top_p: float) -> StepDistribution:
    """The smallest most-likely set whose mass reaches top_p (ties to the lower id), renormalised."""
    ids, lps = dist.token_ids, dist.logprobs
    order = sorted(range(len(ids)), key=lambda i: (-lps[i], ids[i]))
    kept: list[int] = []
    mass = 0.0
    for i in order:
        kept.append(i)
        mass += math.exp(lps[i])
        if mass >= top_p:
            break
    kept.sort()
    log_mass = math.log(math.fsum(math.exp(lps[i]) for i in kept))
    return StepDistribution(tuple(ids[i] for i in kept), tuple(lps[i] - log_mass for i in kept))


def generate(
    model: TokenModel,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    rng: random.Random,
    *,
    constraint: Constraint = FREE,
    top_logprobs: int = 0,
    report: SamplingParams | None = None,
) -> tuple[Generation, Decoder]:
    """Sample one continuation of the prompt. `report` (raw log-probs) gives the distribution
    whose log-probs are reported, where it is not the one sampled from."""
    decoder = model.decoder(prompt_ids, constraint)
    vocabulary = model.vocabulary
    tokens: list[SampledToken] = []
    answer = bytearray()
    while len(tokens) < params.max_tokens:
        dist = decoder.distribution(params)
        # One draw per step even when the choice is forced keeps the RNG stream aligned with the steps.
        token_id = dist.sample(rng.random())
        shown = dist if report is None else decoder.distribution(report)
        tokens.append(
            SampledToken(token_id, shown.logprob(token_id), shown.top(top_logprobs) if top_logprobs else [])
        )
        decoder.advance(token_id)
        if decoder.phase is Phase.DONE or token_id in params.stop_token_ids:
            return Generation(tokens, "stop"), decoder
        if decoder.phase in (Phase.ANSWER, Phase.TEXT) and params.stop:
            answer += vocabulary.token_bytes[token_id]
            text = answer.decode("utf-8", errors="replace")
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                return Generation(tokens, "stop", stop_at=min(hits)), decoder
    return Generation(tokens, "length"), decoder
