"""What both example learners share: the policy they train (the reference model, scored by its
teacher-forced pass), the per-token terms of one trajectory, and the on-policy check."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.client import SampleInfo, TrajectoryInfo
from orchestrator.reference_model import ReferenceModel


class OffPolicy(AssertionError):
    """A token's ratio is not exactly 1, or a trajectory's drift not exactly 0, on the first
    update under the token's own version: what was recorded is not what the policy samples."""


class ReferencePolicy:
    """The policy under training: the reference model the rollouts sample from. Loading a version
    stands in for a weight update; the model names it in its `x-policy-version` header, so every
    turn records the same integer the learner publishes."""

    def __init__(self, model: ReferenceModel) -> None:
        self.model = model

    def load(self, version: int) -> None:
        self.model.set_policy_version(str(version))

    def logprobs(self, sample: SampleInfo, version: str) -> list[float | None]:
        """The teacher-forced pass over a sample's ids under one version, with its sampling settings."""
        return self.model.logprobs(
            sample.token_ids,
            version,
            temperature=sample.sampling.temperature,
            top_p=sample.sampling.top_p,
        )


@dataclass(frozen=True)
class TrajectoryTerms:
    """One trajectory's sampled tokens as an update sees them."""

    episode_id: str
    reward: float
    ratios: list[float]
    """exp(current - behaviour) per sampled (loss-masked) token."""
    drift: float
    """The mean Bernoulli KL proxy between behaviour and current probabilities over those tokens."""


def bernoulli_kl(p: float, q: float) -> float:
    """p*log(p/q) + (1-p)*log((1-p)/(1-q)); a term whose weight is 0 counts 0, and p == q is 0."""
    if p == q:
        return 0.0
    total = 0.0
    if p > 0:
        total += p * math.log(p / q)
    if p < 1:
        total += (1 - p) * math.log((1 - p) / (1 - q))
    return total


def trajectory_terms(trajectory: TrajectoryInfo, policy: ReferencePolicy) -> TrajectoryTerms:
    """Ratios and drift over every sampled token of every sample, each scored under the version
    that sampled it; the current policy is that version's (the first update under it)."""
    ratios: list[float] = []
    kls: list[float] = []
    for sample in trajectory.samples:
        for version in sorted(
            {v for v, m in zip(sample.policy_versions, sample.loss_mask, strict=True) if m}
        ):
            current = policy.logprobs(sample, version)
            for i, masked in enumerate(sample.loss_mask):
                if not masked or sample.policy_versions[i] != version:
                    continue
                behaviour, now = sample.logprobs[i], current[i]
                assert now is not None, "a sampled token always has a token before it"
                ratios.append(math.exp(now - behaviour))
                kls.append(bernoulli_kl(math.exp(behaviour), math.exp(now)))
    if not ratios:
        raise OffPolicy(f"episode {trajectory.episode_id} has no sampled tokens")
    assert trajectory.reward is not None, trajectory.episode_id
    return TrajectoryTerms(trajectory.episode_id, trajectory.reward, ratios, sum(kls) / len(kls))


def check_on_policy(terms: Sequence[TrajectoryTerms]) -> None:
    """Every ratio exactly 1 and every drift exactly 0, or OffPolicy naming the episode."""
    for t in terms:
        off = [(i, r) for i, r in enumerate(t.ratios) if r != 1.0]
        if off or t.drift != 0.0:
            raise OffPolicy(f"episode {t.episode_id}: ratios {off[:5]} drift {t.drift}")


def sequence_mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
