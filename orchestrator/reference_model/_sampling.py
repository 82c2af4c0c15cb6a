"""What one step samples from, and what sampling gives back: the request's sampling parameters, a
support's log-probs (a softmax of logits at a temperature, optionally cut to the top-p nucleus and
renormalised), the draw by inverse CDF, and the tokens drawn."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling settings."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


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


@dataclass(frozen=True)
class Normaliser:
    """What turns logits into log-probs at one step: lp(x) = (x - top) * inverse - log_z."""

    top: float
    inverse: float
    log_z: float

    def __call__(self, logit: float) -> float:
        return (logit - self.top) * self.inverse - self.log_z


def explicit_normaliser(logits: Sequence[float], temperature: float) -> Normaliser:
    """The normaliser of a support given whole, as its logits."""
    inverse = 1.0 / temperature
    top = max(logits)
    return Normaliser(top, inverse, math.log(math.fsum(math.exp((x - top) * inverse) for x in logits)))


def nucleus(dist: StepDistribution, top_p: float) -> StepDistribution:
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
