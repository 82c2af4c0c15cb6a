"""GRPO over groups: each policy version submits a group of N rollouts of one task, takes the
group once all N members are final, and weighs each member's samples by its group-normalised
advantage. Plain Python: the "current" log-probs are the reference model's teacher-forced pass.
"""

from __future__ import annotations

import math
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
from orchestrator.client import EpisodeInfo, GroupInfo, TrajectoryInfo

EPSILON = 1e-6
"""Added to the group's standard deviation, so a group whose rewards are all equal has advantage 0."""


@dataclass(frozen=True)
class GroupUpdate:
    """One update: the group under one policy version, each member's terms and advantage."""

    version: int
    group: GroupInfo
    terms: list[TrajectoryTerms]
    advantages: list[float]
    objective: float
    """Mean over members of advantage times mean token ratio: what the gradient step would ascend."""


def advantages(rewards: Sequence[float]) -> list[float]:
    """(r - mean) / (std + EPSILON) over the group."""
    mean = sequence_mean(rewards)
    std = math.sqrt(sequence_mean([(r - mean) ** 2 for r in rewards]))
    return [(r - mean) / (std + EPSILON) for r in rewards]


def update(
    version: int, group: GroupInfo, trajectories: Mapping[str, TrajectoryInfo], policy: ReferencePolicy
) -> GroupUpdate:
    """The update for a complete group; raises OffPolicy unless it is exactly on-policy."""
    if not group.complete:
        raise RuntimeError(f"group {group.id} cannot complete: {group.problem}")
    members = sorted(group.members, key=lambda m: m.index)
    terms = [trajectory_terms(trajectories[m.episode_id], policy) for m in members]
    check_on_policy(terms)
    adv = advantages([t.reward for t in terms])
    objective = sequence_mean([a * sequence_mean(t.ratios) for a, t in zip(adv, terms, strict=True)])
    return GroupUpdate(version, group, terms, adv, objective)


def train(
    client: StasisClient,
    policy: ReferencePolicy,
    spec: Mapping[str, Any],
    versions: Sequence[int],
    size: int = 4,
    task_id: str = "task",
    on_submitted: Callable[[list[EpisodeInfo]], None] | None = None,
) -> list[GroupUpdate]:
    """For each version: load it, publish it, roll out a group of `size`, update on it."""
    updates = []
    for version in versions:
        policy.load(version)
        client.publish_policy(version)
        run = f"grpo-{uuid.uuid4().hex[:10]}"
        labels = {**spec.get("labels", {}), "learner": run}
        members = client.submit_group({**spec, "labels": labels}, size, group_id=run, task_id=task_id)
        if on_submitted:
            on_submitted(members)
        trajectories: dict[str, TrajectoryInfo] = {}
        for _, item in client.stream_trajectories_and_groups(labels={"learner": run}):
            if isinstance(item, GroupInfo):
                updates.append(update(version, item, trajectories, policy))
                break
            trajectories[item.episode_id] = item
    return updates
