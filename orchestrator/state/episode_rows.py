"""An episode's row as the aggregates that change it read and write it inside their own write
transaction: episodes, snapshots (an autosave moves the resume point) and the trajectory ledger
(a turn is recorded against the episode's current run)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator.domain import Episode, EpisodeState, NotFound
from orchestrator.state import records
from orchestrator.state.sql import Connection, Sql


def fetch(sql: Sql, db: Connection, episode_id: str) -> Episode:
    """The episode as `db` sees it; NotFound if there is none."""
    row = db.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,)).fetchone()
    if row is None:
        raise NotFound(f"episode {episode_id!r} does not exist")
    return sql.dialect.episode(row)


def apply(db: Connection, episode_id: str, changes: Mapping[str, Any]) -> None:
    """Write `changes` (columns of `records.EPISODE_COLUMNS`, or `state`) to the episode's row."""
    if not records.checked_changes(changes):
        return
    values = [json.dumps(v) if isinstance(v, tuple) else v for v in changes.values()]
    db.execute(
        f"UPDATE episodes SET {', '.join(f'{k} = ?' for k in changes)} WHERE id = ?",
        (*values, episode_id),
    )


def live_run(db: Connection, episode_id: str) -> tuple[int, str]:
    """The episode's current run, and why its trajectory takes no more turns ('' while it does),
    read on `db` inside the caller's write transaction (the trajectory ledger's record of a turn),
    so that no transition can commit between this read and that record."""
    row = db.execute("SELECT state, runs FROM episodes WHERE id = ?", (episode_id,)).fetchone()
    if row is None:
        return 0, f"episode {episode_id} is gone"
    ended = EpisodeState(row["state"]).terminal
    return int(row["runs"]), f"episode {episode_id} has ended ({row['state']})" if ended else ""
