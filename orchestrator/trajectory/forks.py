"""A fork child's place in its parent's trajectory: its trajectory begins with the turns its
parent had recorded when the fork's snapshot was taken (the snapshot's ledger cursor), shared,
not copied, and goes on with its own.

`ForkOrigin` says where a child was forked; `Scope` is every turn an episode's trajectory holds:
its own, and each ancestor's up to the cursor of the snapshot the line was forked from. A child
of a child holds its grandparent's turns up to the cursor its parent was forked at, as its
parent did. The ledger keeps each origin (`fork_origins`) the first time it needs it, so a
child's trajectory reads the same after the snapshot is collected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.domain import Episode, SnapshotRecord
from orchestrator.trajectory.turns import Turn


@dataclass(frozen=True)
class ForkOrigin:
    """Where an episode was forked from."""

    parent: str
    """The episode that took the snapshot (`Episode.fork_parent`)."""
    snapshot_id: str
    """The snapshot the child first restored (`Episode.forked_from`)."""
    cursor: int
    """The snapshot's ledger cursor (`trajectory_cursor["turn"]`): the parent's last turn
    recorded before it; 0 if the parent had recorded none."""


def origin_of(episode: Episode | None, snapshot: Callable[[str], SnapshotRecord | None]) -> ForkOrigin | None:
    """Where the episode was forked from, as the state store has it (`snapshot` reads a snapshot's
    record): what a ledger's `origins` answers. None for an episode forked from nothing, and for
    a fork whose source snapshot's record is gone (its cursor with it): read without a prefix."""
    if episode is None or not episode.forked_from:
        return None
    record = snapshot(episode.forked_from)
    cursor = record.trajectory_cursor if record is not None else None
    if not isinstance(cursor, dict) or not isinstance(cursor.get("turn"), int) or cursor["turn"] < 0:
        return None
    return ForkOrigin(episode.fork_parent, episode.forked_from, cursor["turn"])


@dataclass(frozen=True)
class Scope:
    """The turns an episode's trajectory holds: (episode, last turn id) pairs, the episode's own
    first with no bound (None)."""

    parts: tuple[tuple[str, int | None], ...]

    @property
    def episode_id(self) -> str:
        return self.parts[0][0]

    @property
    def forked(self) -> bool:
        return len(self.parts) > 1

    def where(self) -> tuple[str, tuple[object, ...]]:
        """A condition on the turns table (and its parameters) true of the turns in scope."""
        if not self.forked:
            return "episode_id = ?", (self.episode_id,)
        terms: list[str] = ["episode_id = ?"]
        params: list[object] = [self.episode_id]
        for episode_id, last in self.parts[1:]:
            terms.append("(episode_id = ? AND id <= ?)")
            params += [episode_id, last or 0]
        return "(" + " OR ".join(terms) + ")", tuple(params)

    def under(self, origin: ForkOrigin, parent: Scope) -> Scope:
        """This episode's scope, forked at `origin` from the episode whose scope is `parent`."""
        return Scope(((self.episode_id, None), (parent.episode_id, origin.cursor), *parent.parts[1:]))


def own(episode_id: str) -> Scope:
    return Scope(((episode_id, None),))


def shared_view(episode_id: str, turns: Sequence[Turn]) -> list[Turn]:
    """An episode's turns, its ancestors' in scope among them, as its trajectory reads them (in
    id order): an ancestor's turn is `shared`; one the child took the branch of (a turn its
    parent had recorded but the snapshot's harness was still waiting for, which the child asked
    again and sampled itself) reads abandoned, with the shared turns below it, on a branch past
    every other, as a restore divergence leaves them."""
    out = [t if t.episode_id == episode_id else dataclasses.replace(t, shared=True) for t in turns]
    taken = {
        (t.parent_id, t.branch) for t in out if not t.shared and t.parent_id is not None and not t.abandoned
    }
    overtaken: set[int] = set()
    for t in out:  # a parent's id is below its children's
        if t.shared and ((t.parent_id, t.branch) in taken or t.parent_id in overtaken):
            overtaken.add(t.id)
    if not overtaken:
        return out
    moved: dict[int, int] = {}
    past = max(t.branch for t in out) + 1
    for t in out:
        if t.id in overtaken and t.branch not in moved:
            moved[t.branch] = past
            past += 1
    return [
        dataclasses.replace(t, abandoned=True, branch=moved[t.branch]) if t.id in overtaken else t
        for t in out
    ]
