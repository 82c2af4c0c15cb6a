"""FlashREINFORCE, one rollout per prompt: trajectories reach the learner as they finish, never
waiting for siblings. Rewards are centred on the batch; each sampled token has the ratio
exp(current - behaviour); a trajectory whose drift (the mean Bernoulli KL proxy over its sampled
tokens) exceeds a threshold is masked out; the objective is the sample mean, each trajectory
weighing 1/B.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from examples.trainer.learner import (
    ReferencePolicy,
    TrajectoryTerms,
    check_on_policy,
    sequence_mean,
    trajectory_terms,
)
from orchestrator import StasisClient
from orchestrator.client import EpisodeInfo

DRIFT_THRESHOLD = 1e-3
"""A trajectory whose drift exceeds this is left out of the objective (its weight stays 1/B)."""


@dataclass(frozen=True)
class BatchUpdate:
    """One update: the batch under one policy version, in the order its trajectories finished."""

    version: int
    terms: list[TrajectoryTerms]
    advantages: list[float]
    trusted: list[bool]
    """Per trajectory: its drift is within DRIFT_THRESHOLD."""
    objective: float


def update(version: int, terms: Sequence[TrajectoryTerms], threshold: float = DRIFT_THRESHOLD) -> BatchUpdate:
    """The update for a batch; raises OffPolicy unless it is exactly on-policy."""
    check_on_policy(terms)
    mean = sequence_mean([t.reward for t in terms])
    adv = [t.reward - mean for t in terms]
    trusted = [t.drift <= threshold for t in terms]
    objective = sum(
        a * sequence_mean(t.ratios) for a, t, ok in zip(adv, terms, trusted, strict=True) if ok
    ) / len(terms)
    return BatchUpdate(version, list(terms), adv, trusted, objective)


def train(
    client: StasisClient,
    policy: ReferencePolicy,
    specs: Sequence[Mapping[str, Any]],
    versions: Sequence[int],
    on_submitted: Callable[[list[EpisodeInfo]], None] | None = None,
) -> list[BatchUpdate]:
    """For each version: load it, publish it, roll out one episode per spec (one per prompt) and
    score each as it finishes; update once the batch is in."""
    updates = []
    for version in versions:
        policy.load(version)
        client.publish_policy(version)
        run = f"flash-{uuid.uuid4().hex[:10]}"
        episodes = client.submit_many(
            [{**s, "labels": {**s.get("labels", {}), "learner": run}} for s in specs]
        )
        if on_submitted:
            on_submitted(episodes)
        terms: list[TrajectoryTerms] = []
        for trajectory in client.stream_trajectories(labels={"learner": run}):
            if trajectory.reward is None:
                raise RuntimeError(
                    f"episode {trajectory.episode_id} ended {trajectory.state} without a reward"
                )
            terms.append(trajectory_terms(trajectory, policy))
            if len(terms) == len(specs):
                break
        updates.append(update(version, terms))
    return updates
