"""Finished episodes' harness logs, kept whole or as their tail."""

from __future__ import annotations

from typing import Protocol

from orchestrator.state.sql import Sql

COLUMNS = ("episode_id", "start", "content")


class Logs(Protocol):
    def put(self, episode_id: str, start: int, content: bytes) -> None:
        """Keep a finished episode's harness log: `content` begins at byte `start` of it."""

    def get(self, episode_id: str) -> tuple[int, bytes] | None:
        """The kept log, and the byte of the whole log it begins at; None if none was kept."""


class SqlLogs:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql
        self._replace = sql.dialect.replace("logs", COLUMNS)

    def put(self, episode_id: str, start: int, content: bytes) -> None:
        with self._sql.tx() as db:
            db.execute(self._replace, (episode_id, start, content))

    def get(self, episode_id: str) -> tuple[int, bytes] | None:
        with self._sql.read() as db:
            row = db.execute("SELECT start, content FROM logs WHERE episode_id = ?", (episode_id,)).fetchone()
        return (int(row["start"]), bytes(row["content"])) if row is not None else None
