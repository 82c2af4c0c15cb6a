"""Rewards: what an episode's verifier found, kept in the ledger's database beside its turns
(`verifications` in `schema`), one per episode, the last one standing. The control loop records
it (`Verifications.record`) when the verifier exits; the API reads it with the trajectory.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from orchestrator.state.sql import SqlDatabase


@dataclass
class Verification:
    reward: float | None
    exit_code: int | None
    timed_out: bool
    log: bytes
    duration_ms: float
    metrics: dict[str, float] = field(default_factory=dict)
    """Named numbers the verifier reported beside the reward (a Harbor task's reward.json)."""


class Verifications:
    """The verifier's findings per episode, durable in the ledger's database."""

    def __init__(self, database: SqlDatabase) -> None:
        self._tx = database.tx
        self._read = database.read

    def record(self, episode_id: str, v: Verification) -> None:
        """Keep what the verifier found for the episode, in place of any earlier finding."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO verifications (episode_id, reward, exit_code, timed_out, log, duration_ms, at, metrics)"
                " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (episode_id) DO UPDATE SET reward = excluded.reward,"
                " exit_code = excluded.exit_code, timed_out = excluded.timed_out, log = excluded.log,"
                " duration_ms = excluded.duration_ms, at = excluded.at, metrics = excluded.metrics",
                (
                    episode_id,
                    v.reward,
                    v.exit_code,
                    int(v.timed_out),
                    v.log,
                    v.duration_ms,
                    time.time(),
                    json.dumps(v.metrics),
                ),
            )

    def get(self, episode_id: str) -> Verification | None:
        """What the verifier last found for the episode; None if it has not run."""
        with self._read() as db:
            r = db.execute("SELECT * FROM verifications WHERE episode_id = ?", (episode_id,)).fetchone()
        if r is None:
            return None
        return Verification(
            r["reward"], r["exit_code"], bool(r["timed_out"]), bytes(r["log"]), r["duration_ms"],
            json.loads(r["metrics"]),
        )  # fmt: skip
