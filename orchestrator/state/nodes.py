"""The nodes registered with the control plane: their address, capacity, images and state. A
registration and a change of state each commit with their event."""

from __future__ import annotations

import json
from typing import Protocol

from orchestrator.domain import NodeRecord, NodeState, NotFound
from orchestrator.state import events, records
from orchestrator.state.sql import Connection, Sql

COLUMNS = (
    "name", "address", "state", "backend", "slots", "memory_mb", "images", "labels", "registered_at", "disk_mb",
    "restores_forks",
)  # fmt: skip
"""The columns of `nodes`, in the order of `records.node_row`."""


class Nodes(Protocol):
    def upsert(self, node: NodeRecord) -> NodeRecord:
        """Register or refresh a node. A node that comes back keeps a cordon or drain set on it."""

    def all(self) -> list[NodeRecord]:
        """Every registered node, by name."""

    def get(self, name: str) -> NodeRecord:
        """NotFound, naming the known nodes, if `name` is not registered."""

    def set_state(self, name: str, state: NodeState, reason: str) -> NodeRecord: ...

    def set_images(self, name: str, images: dict[str, list[str]]) -> None:
        """What the node holds of each image, as it last reported."""


class SqlNodes:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql
        self._replace = sql.dialect.replace("nodes", COLUMNS)

    def upsert(self, node: NodeRecord) -> NodeRecord:
        with self._sql.tx() as db:
            row = db.execute("SELECT state FROM nodes WHERE name = ?", (node.name,)).fetchone()
            state = node.state
            if row is not None and NodeState(row["state"]) in (NodeState.CORDONED, NodeState.DRAINING):
                state = NodeState(row["state"])
            db.execute(self._replace, records.node_row(node, state))
            events.record(self._sql, db, "", "node", "", str(state), "registered", node.name, node.address)
            return _node(db, node.name)

    def set_images(self, name: str, images: dict[str, list[str]]) -> None:
        with self._sql.tx() as db:
            db.execute("UPDATE nodes SET images = ? WHERE name = ?", (json.dumps(images), name))

    def all(self) -> list[NodeRecord]:
        with self._sql.read() as db:
            return [records.node_from_row(r) for r in db.execute("SELECT * FROM nodes ORDER BY name")]

    def get(self, name: str) -> NodeRecord:
        with self._sql.read() as db:
            row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(n.name for n in self.all()) or "none"
            raise NotFound(f"node {name!r} is not registered; known nodes: {known}")
        return records.node_from_row(row)

    def set_state(self, name: str, state: NodeState, reason: str) -> NodeRecord:
        with self._sql.tx() as db:
            current = _node(db, name)
            if current.state != state:
                db.execute("UPDATE nodes SET state = ? WHERE name = ?", (str(state), name))
                events.record(self._sql, db, "", "node", str(current.state), str(state), reason, name, "")
            return _node(db, name)


def _node(db: Connection, name: str) -> NodeRecord:
    row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise NotFound(f"node {name!r} is not registered")
    return records.node_from_row(row)
