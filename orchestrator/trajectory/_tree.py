"""Where a freshly sampled turn goes in its episode's tree, by the matching rule (`ledger`'s
docstring): its branch, its edge and the turn it hangs from (`edges`), and which earlier siblings
the restored sandbox never had, so that they and their descendants are abandoned.

Every function runs inside the ledger's write transaction that records the turn, so that two
turns placed at once are placed as if one came after the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.state.sql import Connection
from orchestrator.trajectory import edges
from orchestrator.trajectory.canonical import CanonicalRequest
from orchestrator.trajectory.forks import Scope
from orchestrator.trajectory.turns import Lineage


@dataclass(frozen=True)
class Place:
    """Where a new turn goes."""

    edge: edges.Edge
    edge_parent: int | None
    """The turn it hangs from (`Turn.edge_parent`)."""
    branch: int
    abandoned: bool
    """A later run already went its own way from the same parent: the turn is recorded abandoned."""


def place(
    db: Connection,
    scope: Scope,
    run: int,
    current: int,
    resumed_at: float,
    lineage: Lineage,
    request: CanonicalRequest,
) -> Place:
    """Place a turn sampled for `run` (the episode is on run `current` now) whose prompt stands to
    its parent as `lineage` says, abandoning the stale siblings it diverges from (see
    `Ledger.record`). In a fork child (`scope`), the parent may be a turn it shares with its
    parent episode; only the child's own turns are ever abandoned."""
    episode_id = scope.episode_id
    parent_id = lineage.parent_id
    parent = (
        db.execute("SELECT branch, episode_id FROM turns WHERE id = ?", (parent_id,)).fetchone()
        if parent_id is not None
        else None
    )
    where = "episode_id = ? AND parent_id IS NOT DISTINCT FROM ? AND abandoned = 0"  # NULL-safe =
    # In index order, stated so that every database numbers the abandoned branches alike.
    earlier = db.execute(
        f"SELECT id, branch, delivered_at, sending_at FROM turns WHERE {where} AND delivered_run < ?"
        " AND sending_run < ? ORDER BY delivered_run, id",
        (episode_id, parent_id, run, run),
    ).fetchall()
    stale = [
        s
        for s in earlier
        if all(s[at] is None or s[at] > resumed_at for at in ("delivered_at", "sending_at"))
    ]
    overtaken = current > run and (
        db.execute(
            f"SELECT 1 FROM turns WHERE {where} AND (delivered_run > ? OR sending_run > ?) LIMIT 1",
            (episode_id, parent_id, run, run),
        ).fetchone()
        is not None
    )
    next_branch = next_branch_of(db, scope)
    base = parent["branch"] if parent is not None else 0
    shared = parent is not None and parent["episode_id"] != episode_id
    for s in stale:
        # The diverged continuation keeps its turns under a new branch number; the new turn
        # takes over the branch it was on.
        moved = s["branch"] == base
        _abandon(db, s["id"], old_branch=s["branch"], new_branch=next_branch if moved else s["branch"])
        next_branch += int(moved)
    edge, edge_parent, branch = _edge(
        db,
        scope,
        shared,
        edges.shape(request),
        request.fingerprint,
        parent_id,
        base,
        bool(stale),
        next_branch,
    )
    if overtaken:  # a branch of its own, past any `_edge` just took
        branch = next_branch_of(db, scope)
    return Place(edge, edge_parent, branch, overtaken)


def _edge(
    db: Connection,
    scope: Scope,
    shared: bool,
    shape: edges.Shape,
    fingerprint: str,
    parent_id: int | None,
    base: int,
    diverged: bool,
    next_branch: int,
) -> tuple[edges.Edge, int | None, int]:
    """The new turn's edge, the turn it hangs from and its branch (see `edges`). `shared`: the
    parent is a turn the fork child shares with its parent episode, and the first of the child's
    own turns below it hangs from it by a fork edge. A turn with no parent is told among every
    turn in scope: a fork child's primary conversation is the one it shares."""
    episode_id = scope.episode_id
    if parent_id is not None:
        if shape.asks_for_summary:
            return edges.Edge.COMPACTION, parent_id, next_branch
        if _held(db, episode_id, parent_id, base):
            return edges.Edge.PARALLEL, parent_id, next_branch
        if diverged:
            return edges.Edge.DIVERGENCE, parent_id, base
        return (edges.Edge.FORK if shared else edges.Edge.CONTINUATION), parent_id, base
    within, params = scope.where()
    live = f"{within} AND abandoned = 0"
    compactions = db.execute(
        f"SELECT id, branch, answer, edge_parent FROM turns WHERE {live} AND edge = ? ORDER BY id DESC",
        (*params, edges.Edge.COMPACTION.value),
    ).fetchall()
    summaries = {c["id"]: edges.answer_text(json.loads(c["answer"])) for c in compactions}
    if shape.continues_summary(summaries.values()):
        if not compactions:  # summarised elsewhere: main carries on, from no recorded turn
            return edges.Edge.CONTINUATION, None, 0
        of = next((c for c in compactions if summaries[c["id"]] and summaries[c["id"]] in shape.first_user),
                  compactions[0])  # fmt: skip
        continued = db.execute("SELECT branch FROM turns WHERE id = ?", (of["edge_parent"],)).fetchone()
        return edges.Edge.CONTINUATION, of["id"], continued["branch"] if continued is not None else 0
    if shape.first_user:
        for row in db.execute(
            f"SELECT id, spawns FROM turns WHERE {live} AND spawns <> '[]' ORDER BY id DESC",
            params,
        ):
            if any(p in shape.first_user for p in json.loads(row["spawns"])):
                return edges.Edge.SUBAGENT, row["id"], next_branch
    primary = db.execute(
        f"SELECT id, episode_id, tools_key, fingerprint FROM turns WHERE {live} AND parent_id IS NULL"
        " AND branch = 0 ORDER BY id LIMIT 1",
        params,
    ).fetchone()
    if primary is None:
        return edges.Edge.ROOT, None, 0
    if primary["fingerprint"] == fingerprint:  # asked again and sampled afresh
        return edges.Edge.PARALLEL, None, next_branch
    if not shape.tools and primary["tools_key"]:
        return edges.Edge.SIDE_CALL, None, next_branch
    if (
        shape.tools
        and not primary["tools_key"]
        and primary["episode_id"] == episode_id  # a shared turn is its episode's, as it was recorded
        and not _has_children(db, primary["id"])
    ):
        # What began the episode listing no tools, alone, was a side call (a title, a topic
        # check) made before the primary conversation's first request was recorded.
        db.execute(
            "UPDATE turns SET edge = ?, branch = ? WHERE id = ?",
            (edges.Edge.SIDE_CALL.value, next_branch, primary["id"]),
        )
        return edges.Edge.ROOT, None, 0
    return edges.Edge.SUBAGENT, None, next_branch


def _held(db: Connection, episode_id: str, parent_id: int, branch: int) -> bool:
    """A live child of the parent is on this branch."""
    return (
        db.execute(
            "SELECT 1 FROM turns WHERE episode_id = ? AND parent_id = ? AND abandoned = 0 AND branch = ? LIMIT 1",
            (episode_id, parent_id, branch),
        ).fetchone()
        is not None
    )


def next_branch_of(db: Connection, scope: Scope) -> int:
    """The branch number past every one the episode has used, and every one of the turns it
    shares with its fork's parent."""
    within, params = scope.where()
    return int(
        db.execute(
            f"SELECT COALESCE(MAX(branch), -1) + 1 AS branch FROM turns WHERE {within}", params
        ).fetchone()["branch"]
    )


def _has_children(db: Connection, turn_id: int) -> bool:
    return db.execute("SELECT 1 FROM turns WHERE parent_id = ? LIMIT 1", (turn_id,)).fetchone() is not None


def _abandon(db: Connection, turn_id: int, old_branch: int, new_branch: int) -> None:
    """Abandon the turn and its descendants; those on `old_branch` move to `new_branch`."""
    todo = [turn_id]
    while todo:
        current = todo.pop()
        db.execute(
            "UPDATE turns SET abandoned = 1, branch = CASE WHEN branch = ? THEN ? ELSE branch END WHERE id = ?",
            (old_branch, new_branch, current),
        )
        todo += [r["id"] for r in db.execute("SELECT id FROM turns WHERE parent_id = ?", (current,))]
