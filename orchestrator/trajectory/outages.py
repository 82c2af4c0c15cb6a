"""Upstream outages, told apart from a harness's own failure.

The gateway notes every request its model server failed (unreachable, timed out, a 5xx, an
unreadable answer) against the episode's run (`Outages.failed`). When a GRPO group's member then
exits, the control loop asks whether the last thing its run had from the gateway was such a
failure (`Outages.cut_short`): a run that recorded no turn after its model server failed it was
cut short by the infrastructure, not ended by the harness, and the member runs again from its
last snapshot, or from the start, rather than be graded on a run the outage ended. Each member is
given `group_max_attempts` such re-runs (`Outages.rerun` counts them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from orchestrator.state.sql import SqlDatabase


@dataclass(frozen=True)
class Outage:
    """A run whose last exchange with the gateway was a model-server failure."""

    why: str
    """The failure, as the gateway told the harness."""
    failed_at: float
    reruns: int
    """How many runs of the episode ended so before this one was re-run."""


class Outages:
    """The upstream failures of each episode's runs, in the ledger's database (`upstream_failures`
    in `schema`): the last one per run, and whether the control loop re-ran the episode over it."""

    def __init__(self, database: SqlDatabase) -> None:
        self._tx = database.tx
        self._read = database.read

    def failed(self, episode_id: str, run: int, why: str) -> None:
        """Note that the model server failed a request of the episode's `run` (the gateway)."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO upstream_failures (episode_id, run, failed_at, why, rerun) VALUES (?, ?, ?, ?, 0)"
                " ON CONFLICT (episode_id, run) DO UPDATE SET failed_at = excluded.failed_at,"
                " why = excluded.why",
                (episode_id, run, time.time(), why[:500]),
            )

    def cut_short(self, episode_id: str, run: int) -> Outage | None:
        """The outage that ended the run, if its model server failed it after its last recorded
        turn; None if the run ended on its own (a turn followed the last failure, or none came)."""
        with self._read() as db:
            r = db.execute(
                "SELECT failed_at, why FROM upstream_failures WHERE episode_id = ? AND run = ?",
                (episode_id, run),
            ).fetchone()
            if r is None:
                return None
            later = db.execute(
                "SELECT 1 FROM turns WHERE episode_id = ? AND run = ? AND created_at > ? LIMIT 1",
                (episode_id, run, r["failed_at"]),
            ).fetchone()
            reruns = db.execute(
                "SELECT COUNT(*) AS n FROM upstream_failures WHERE episode_id = ? AND rerun = 1",
                (episode_id,),
            ).fetchone()["n"]
        return None if later is not None else Outage(r["why"], r["failed_at"], int(reruns))

    def rerun(self, episode_id: str, run: int) -> None:
        """Note that the episode runs again over the outage that cut `run` short."""
        with self._tx() as db:
            db.execute(
                "UPDATE upstream_failures SET rerun = 1 WHERE episode_id = ? AND run = ?", (episode_id, run)
            )
