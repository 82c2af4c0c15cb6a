"""The reference model as a language model over tokens: the next-token distribution is a function
of the token prefix, the policy version and the sampling parameters alone.

A prefix is read for where it stands (`TokenModel.context`, in `_token_model`). After `<|im_start|>assistant\\n` it is inside
an assistant turn, whose grammar is Qwen3's: optional reasoning (`<think>\\n…\\n</think>\\n\\n`),
then an answer (free text, then `<|im_end|>`) or one or more tool calls (`<tool_call>` call JSON
`</tool_call>`, separated by a newline, then `<|im_end|>`). The tools a call may name are read from
the tool listing in the prompt's system turn, and the answer-or-call odds from the tool results
in it. Anywhere else the text is free, ended by `<|endoftext|>`.

At every step the grammar decides which tokens are allowed; the distribution is the softmax of
their logits at the request's temperature, optionally cut to the top-p nucleus, and renormalised
over what is left. A sampled token's log-prob is its log-prob under exactly that distribution, and
`TokenModel.logprobs` (a teacher-forced pass) computes the very same floats.

This module walks that grammar: the phases of a turn, the constraint a request adds, a `Decoder`
that gives each step's support and takes its token, and `generate`, which samples a continuation.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.reference_model._grammar import State
from orchestrator.reference_model._sampling import (
    Generation,
    Normaliser,
    SampledToken,
    SamplingParams,
    StepDistribution,
    explicit_normaliser,
    nucleus,
)
from orchestrator.reference_model._weights import CONTEXT_WINDOW

if TYPE_CHECKING:
    from orchestrator.reference_model._token_model import Context, TokenModel

CANONICAL_PENALTY = 8.0
"""Nats taken off a call-grammar token when a longer allowed token extends it, so calls are
tokenized canonically (as a trained model would) while real choices stay open."""
ANSWER_SLOPE = 1.5
"""Steepness of the answer-vs-call hazard around the mean number of tool turns."""
PARALLEL_CALL_PROBABILITY = 0.1
"""Chance (at temperature 1) of a further call in the same response after a complete call."""


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
class Constraint:
    """What a chat request's `tool_choice` and `parallel_tool_calls` add, as guided decoding does
    on a model server: a mask on the distribution, outside the tokens."""

    tools: frozenset[str] | None = None
    """The tools a call may name; None: every tool the prompt lists."""
    require_call: bool = False
    forbid_calls: bool = False
    parallel_calls: bool = True


FREE = Constraint()


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
        norm: Normaliser | None = None
        if step.explicit:
            ids = [t for t, _ in step.explicit]
            logits = [x for _, x in step.explicit]
            if params.temperature:
                norm = explicit_normaliser(logits, params.temperature)
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
        # Normaliser.__call__'s arithmetic, inlined: the same floats.
        dist = StepDistribution(tuple(ids), tuple((x - top) * inverse - log_z for x in logits))
        return nucleus(dist, params.top_p) if params.top_p < 1.0 else dist

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
