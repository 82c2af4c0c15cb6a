"""GRPO groups: N episodes of one task whose rewards a trainer normalises together, and what a
group's members came to once all of them are final."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.domain.episode import Episode, EpisodeState
from orchestrator.domain.errors import InvalidArgument

MAX_GROUP_SIZE = 1000
"""Members a group may have: all of them are submitted in one SubmitEpisodes call, which carries
at most this many episodes."""
MAX_GROUP_ID = 200
"""Characters of a group id or task id: as long as a request id."""
_GROUP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


@dataclass(frozen=True)
class Group:
    id: str
    """Chosen by the trainer; unique in the cluster."""
    task_id: str
    """The task every member runs: what the group's rewards are compared within."""
    size: int
    """N, the members whose rewards complete the group."""
    created_at: float = 0.0
    max_staleness: int | None = None
    """The most policy versions a member's oldest live tokens may lag the published version its
    next turn is sampled under; None: no bound. A turn past it is held back by the gateway, and the
    control loop runs the member again from the start (`trajectory.policy.beyond_bound`)."""

    def validate(self) -> Group:
        for name, value in (("group.id", self.id), ("group.task_id", self.task_id)):
            if not value:
                raise InvalidArgument(name, "is required")
            if len(value) > MAX_GROUP_ID or not _GROUP_ID.fullmatch(value):
                raise InvalidArgument(
                    name, f"{value[:40]!r} must be at most {MAX_GROUP_ID} of A-Z a-z 0-9 . _ : / -, "
                    "beginning with a letter or digit"
                )  # fmt: skip
        if not 1 <= self.size <= MAX_GROUP_SIZE:
            raise InvalidArgument("group.size", f"{self.size} must be between 1 and {MAX_GROUP_SIZE}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise InvalidArgument("group.max_staleness", f"{self.max_staleness} must not be negative")
        return self

    def same_as(self, stored: Group) -> None:
        """InvalidArgument, naming the field, if this group's id is taken by another group."""
        for name, mine, theirs in (
            ("group.task_id", self.task_id, stored.task_id),
            ("group.size", self.size, stored.size),
            ("group.max_staleness", self.max_staleness, stored.max_staleness),
        ):
            if mine != theirs:
                raise InvalidArgument(
                    name, f"group {self.id!r} exists with {name.split('.')[1]} {theirs!r}, not {mine!r}"
                )


@dataclass(frozen=True)
class GroupMember:
    index: int
    episode_id: str
    state: EpisodeState
    reason: str
    reward: float | None
    finished_at: float = 0.0


@dataclass(frozen=True)
class GroupOutcome:
    """Where a group stands: complete once every member succeeded with a reward; broken once
    one cannot (it failed or was cancelled), naming that member and why."""

    group: Group
    members: tuple[GroupMember, ...]

    @property
    def final(self) -> int:
        return sum(m.state.terminal for m in self.members)

    @property
    def complete(self) -> bool:
        return len(self.members) == self.group.size and all(
            m.state == EpisodeState.SUCCEEDED and m.reward is not None for m in self.members
        )

    @property
    def broken_by(self) -> GroupMember | None:
        """The first member to end without a reward (failed, cancelled, or a success that no
        verifier scored): the group cannot complete."""
        unrewarded = [m for m in self.members if m.state.terminal and m.reward is None]
        return min(unrewarded, key=lambda m: (m.finished_at, m.index), default=None)

    @property
    def decided_by(self) -> GroupMember | None:
        """The member whose end decided the outcome: the last to end of a complete group, or the
        first to end without a reward; None while it is open."""
        if self.complete:
            return max(self.members, key=lambda m: (m.finished_at, m.index))
        return self.broken_by

    @property
    def problem(self) -> str:
        m = self.broken_by
        if m is None:
            return ""
        return f"member {m.index} ({m.episode_id}) {m.state.lower()} without a reward: {m.reason}"

    @staticmethod
    def of(group: Group, episodes: list[Episode]) -> GroupOutcome:
        members = sorted(
            (GroupMember(e.group_index, e.id, e.state, e.reason, e.reward, e.finished_at) for e in episodes),
            key=lambda m: m.index,
        )
        return GroupOutcome(group, tuple(members))
