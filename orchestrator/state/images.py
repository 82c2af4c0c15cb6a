"""The image catalogue: the images imported into the cluster, by name."""

from __future__ import annotations

from typing import Protocol

from orchestrator.domain import ImageRecord, NotFound
from orchestrator.state.sql import Sql

COLUMNS = ("name", "reference", "digest", "size_bytes", "source", "created_at")


class Images(Protocol):
    def put(self, image: ImageRecord) -> None:
        """Add an image to the catalogue, or replace the one of its name."""

    def all(self) -> list[ImageRecord]:
        """Every image, by name."""

    def get(self, name: str) -> ImageRecord | None: ...

    def delete(self, name: str) -> ImageRecord:
        """Remove a catalogue entry; NotFound if there is none."""


class SqlImages:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql
        self._replace = sql.dialect.replace("images", COLUMNS)

    def put(self, image: ImageRecord) -> None:
        with self._sql.tx() as db:
            db.execute(
                self._replace,
                (image.name, image.reference, image.digest, image.size_bytes, image.source, image.created_at),
            )

    def all(self) -> list[ImageRecord]:
        with self._sql.read() as db:
            return [ImageRecord(**r) for r in db.execute("SELECT * FROM images ORDER BY name")]

    def get(self, name: str) -> ImageRecord | None:
        with self._sql.read() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
        return ImageRecord(**row) if row is not None else None

    def delete(self, name: str) -> ImageRecord:
        with self._sql.tx() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
            if row is None:
                known = ", ".join(r["name"] for r in db.execute("SELECT name FROM images ORDER BY name"))
                raise NotFound(f"image {name!r} was not imported; imported images: {known or 'none'}")
            db.execute("DELETE FROM images WHERE name = ?", (name,))
            return ImageRecord(**row)
