"""Token-by-token decoding: the response grammar, the next-token distribution, sampling and scoring.

A response is either an answer (free text, then the end token) or one or
more tool calls (``<tool_call>`` call-JSON ``</tool_call>``, then the end
token). At every step the decoder knows which tokens the grammar allows; the
distribution is the softmax of their logits at the request's temperature,
optionally cut to the top-p nucleus, and renormalised over what is left. The
log-prob reported for a sampled token is its log-prob under exactly that
distribution, and ``score`` replays a token sequence to recover every step's
distribution.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.reference_model._grammar import CallGrammar, State
from orchestrator.reference_model._vocabulary import IM_END, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Vocabulary
from orchestrator.reference_model._weights import PolicyWeights, digest

CANONICAL_PENALTY = 8.0
"""Nats taken off a call-grammar token when a longer allowed token extends it, so calls are
tokenized canonically (as a trained model would) while real choices stay open."""
ANSWER_SLOPE = 1.5
"""Steepness of the answer-vs-call hazard around the mean number of tool turns."""
PARALLEL_CALL_PROBABILITY = 0.1
"""Chance (at temperature 1) of a further call in the same response after a complete call."""
_EDGE = 1e-6


class Phase(enum.Enum):
    """Where in the response grammar the decoder is."""

    START = "start"
    ANSWER = "answer"
    CALL = "call"
    AFTER_CALL = "after_call"
    DONE = "done"


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling settings."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResponseShape:
    """What a response may contain and how its length is shaped."""

    end_id: int
    grammar: CallGrammar | None = None
    may_answer: bool = True
    parallel_calls: bool = True
    tool_results: int = 0
    mean_tool_turns: float = 5.0
    mean_answer_tokens: float = 24.0


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


def end_probability(answer_tokens: int, mean_answer_tokens: float) -> float:
    """P(end the answer now) at temperature 1 after answer_tokens answer tokens."""
    scale = max(1.0, mean_answer_tokens / 8)
    return sigmoid((answer_tokens - mean_answer_tokens) / scale)


def _logsumexp(values: Sequence[float]) -> float:
    m = max(values)
    return m + math.log(sum(map(math.exp, [v - m for v in values])))


def calibrated_logit(probability: float, other_logits: Sequence[float]) -> float:
    """The logit that gives one extra token exactly this probability against the others at temperature 1."""
    p = min(max(probability, _EDGE), 1 - _EDGE)
    return math.log(p) - math.log1p(-p) + _logsumexp(other_logits)


def distribution(
    token_ids: Sequence[int], logits: Sequence[float], params: SamplingParams
) -> StepDistribution:
    """Softmax at the temperature, cut to the top-p nucleus and renormalised; temperature 0 is greedy."""
    if params.temperature == 0:
        best = max(range(len(token_ids)), key=lambda i: (logits[i], -token_ids[i]))
        return StepDistribution((token_ids[best],), (0.0,))
    inv = 1.0 / params.temperature
    m = max(logits)
    scaled = [(x - m) * inv for x in logits]
    log_z = math.log(sum(map(math.exp, scaled)))
    ids = tuple(token_ids)
    lps = tuple(s - log_z for s in scaled)
    if params.top_p < 1.0:
        order = sorted(range(len(ids)), key=lambda i: (-lps[i], ids[i]))
        kept: list[int] = []
        mass = 0.0
        for i in order:
            kept.append(i)
            mass += math.exp(lps[i])
            if mass >= params.top_p:
                break
        kept.sort()
        log_mass = math.log(sum(math.exp(lps[i]) for i in kept))
        ids = tuple(ids[i] for i in kept)
        lps = tuple(lps[i] - log_mass for i in kept)
    return StepDistribution(ids, lps)


class Decoder:
    """Walks the response grammar for one request; gives each step's distribution and takes its token."""

    def __init__(
        self,
        weights: PolicyWeights,
        prompt_ids: Sequence[int],
        shape: ResponseShape,
        params: SamplingParams,
    ) -> None:
        vocabulary: Vocabulary = weights.vocabulary
        self._weights = weights
        self._vocabulary = vocabulary
        self._shape = shape
        self._params = params
        self._context = list(prompt_ids)
        self._prompt_digest = digest(prompt_ids)
        self._open = vocabulary.id_of(TOOL_CALL_OPEN)
        self._close = vocabulary.id_of(TOOL_CALL_CLOSE)
        self.phase = Phase.START
        self._call_state: State = frozenset()
        self._answer_tokens = 0
        self.calls = 0
        if shape.grammar is None and not shape.may_answer:
            raise ValueError("a response must be allowed to answer or to call a tool")

    def _logits(self, token_ids: Sequence[int]) -> list[float]:
        bucket = self._weights.context_key(self._prompt_digest, self._context)
        return self._weights.logits(bucket, token_ids)

    def distribution(self) -> StepDistribution:
        """The distribution of the next token."""
        shape = self._shape
        generation = self._vocabulary.generation_ids
        if self.phase is Phase.START:
            if shape.grammar is None:
                return distribution(generation, self._logits(generation), self._params)
            if not shape.may_answer:
                return distribution([self._open], [0.0], self._params)
            text_logits = self._logits(generation)
            p_call = 1.0 - answer_probability(shape.tool_results, shape.mean_tool_turns)
            call_logit = calibrated_logit(p_call, text_logits)
            return distribution([self._open, *generation], [call_logit, *text_logits], self._params)
        if self.phase is Phase.ANSWER:
            text_logits = self._logits(generation)
            p_end = end_probability(self._answer_tokens, shape.mean_answer_tokens)
            end_logit = calibrated_logit(p_end, text_logits)
            # The end token (im_end/endoftext) has a lower id than every generation token.
            return distribution([shape.end_id, *generation], [end_logit, *text_logits], self._params)
        if self.phase is Phase.CALL:
            return self._call_distribution()
        if self.phase is Phase.AFTER_CALL:
            if not shape.parallel_calls:
                return distribution([shape.end_id], [0.0], self._params)
            end_logit = self._logits([shape.end_id])[0]
            more_logit = calibrated_logit(PARALLEL_CALL_PROBABILITY, [end_logit])
            pairs = sorted([(shape.end_id, end_logit), (self._open, more_logit)])
            return distribution([p[0] for p in pairs], [p[1] for p in pairs], self._params)
        raise ValueError("the response is already complete")

    def _call_distribution(self) -> StepDistribution:
        grammar = self._shape.grammar
        assert grammar is not None
        allowed = sorted(grammar.allowed(self._call_state))
        logits = self._logits(allowed)
        tokens = self._vocabulary.tokens
        by_text = sorted(range(len(allowed)), key=lambda i: tokens[allowed[i]])
        for pos, i in enumerate(by_text[:-1]):
            nxt = tokens[allowed[by_text[pos + 1]]]
            if nxt.startswith(tokens[allowed[i]]):
                logits[i] -= CANONICAL_PENALTY
        if grammar.accepting(self._call_state):
            close_logit = self._logits([self._close])[0]
            allowed.insert(0, self._close)
            logits.insert(0, close_logit)
        if not allowed:
            raise ValueError("the call grammar allows no continuation")
        return distribution(allowed, logits, self._params)

    def advance(self, token_id: int) -> None:
        """Take token_id as the next token; it must be in the support of the current distribution."""
        shape = self._shape
        if self.phase is Phase.START:
            if token_id == self._open and shape.grammar is not None:
                self.phase = Phase.CALL
                self._call_state = shape.grammar.start()
            elif shape.may_answer and token_id in self._vocabulary.generation_set:
                self.phase = Phase.ANSWER
                self._answer_tokens = 1
            else:
                raise ValueError(f"token {token_id} cannot start the response")
        elif self.phase is Phase.ANSWER:
            if token_id == shape.end_id:
                self.phase = Phase.DONE
            elif token_id in self._vocabulary.generation_set:
                self._answer_tokens += 1
            else:
                raise ValueError(f"token {token_id} cannot continue an answer")
        elif self.phase is Phase.CALL:
            assert shape.grammar is not None
            if token_id == self._close and shape.grammar.accepting(self._call_state):
                self.phase = Phase.AFTER_CALL
                self.calls += 1
            else:
                nxt = (
                    shape.grammar.advance(self._call_state, self._vocabulary.tokens[token_id])
                    if token_id in self._vocabulary.generation_set
                    else frozenset()
                )
                if not nxt:
                    raise ValueError(f"token {token_id} leaves the tool-call grammar")
                self._call_state = nxt
        elif self.phase is Phase.AFTER_CALL:
            if token_id == shape.end_id:
                self.phase = Phase.DONE
            elif token_id == self._open and shape.parallel_calls and shape.grammar is not None:
                self.phase = Phase.CALL
                self._call_state = shape.grammar.start()
            else:
                raise ValueError(f"token {token_id} cannot follow a complete call")
        else:
            raise ValueError("the response is already complete")
        self._context.append(token_id)


def generate(
    weights: PolicyWeights,
    prompt_ids: Sequence[int],
    shape: ResponseShape,
    params: SamplingParams,
    rng: random.Random,
    top_logprobs: int = 0,
) -> Generation:
    """Sample one response."""
    decoder = Decoder(weights, prompt_ids, shape, params)
    vocabulary = weights.vocabulary
    tokens: list[SampledToken] = []
    answer = bytearray()
    while len(tokens) < params.max_tokens:
        dist = decoder.distribution()
        # One draw per step even when the choice is forced keeps the RNG stream aligned with the steps.
        u = rng.random()
        token_id = dist.sample(u)
        tokens.append(
            SampledToken(token_id, dist.logprob(token_id), dist.top(top_logprobs) if top_logprobs else [])
        )
        decoder.advance(token_id)
        if decoder.phase is Phase.DONE:
            return Generation(tokens, "tool_calls" if decoder.calls else "stop")
        if decoder.phase is Phase.ANSWER and params.stop:
            answer += vocabulary.token_bytes[token_id]
            text = answer.decode("utf-8", errors="replace")
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                return Generation(tokens, "stop", stop_at=min(hits))
    return Generation(tokens, "length")


def score(
    weights: PolicyWeights,
    prompt_ids: Sequence[int],
    shape: ResponseShape,
    params: SamplingParams,
    token_ids: Sequence[int],
) -> list[StepDistribution]:
    """Replay token_ids after the prompt and return the distribution each one was drawn from."""
    decoder = Decoder(weights, prompt_ids, shape, params)
    out: list[StepDistribution] = []
    for token_id in token_ids:
        out.append(decoder.distribution())
        decoder.advance(token_id)
    return out


def end_token_id(vocabulary: Vocabulary) -> int:
    """The chat end-of-turn token."""
    return vocabulary.id_of(IM_END)
