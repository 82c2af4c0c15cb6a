"""The embedded state store: episodes, their events, snapshots, nodes and request ids in one
SQLite file (WAL, synchronous=FULL).

Every state change commits together with its event in one transaction, so a crash at any moment
loses no transition and leaves no change without its reason. Specs are stored as plain data and
read back without validation: they were validated once, when they were submitted.
"""

from __future__ import annotations

import ipaddress
import json
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    Event,
    FailedPrecondition,
    ImageRecord,
    NodeRecord,
    NodeState,
    NotFound,
    SnapshotRecord,
    current_caller,
    ids,
)
from orchestrator.state import records
from orchestrator.state.database import Database
from orchestrator.state.schema import SCHEMA


class SqliteStateStore:
    """The embedded store: one SQLite file in WAL mode, fsync on every commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._database = Database(path, SCHEMA, on_commit=lambda: self._changed.notify_all())
        self._db = self._database.db
        self._lock = self._database.lock
        self._changed = threading.Condition(self._lock)
        self._tx = self._database.tx
        self._next_address = 0
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(events)")}
        if "actor" not in columns:  # a state directory from before events recorded who asked
            self._db.execute("ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        self._database.close()
        with self._changed:
            self._changed.notify_all()

    # -- episodes ---------------------------------------------------------------------------

    def _row_to_episode(self, row: sqlite3.Row) -> Episode:
        return records.episode_from_row(dict(zip(row.keys(), row, strict=True)))  # quicker than row[name]

    def _free_address(self, db: sqlite3.Connection, pool: ipaddress.IPv4Network) -> str:
        """The next address of the pool that no live episode holds, going round from the last one
        handed out: one index lookup per submit, and a freed address is the last to be reused."""
        first = int(pool.network_address) + 1
        count = pool.num_addresses - 2
        start = self._next_address - first if first <= self._next_address < first + count else 0
        held = "SELECT 1 FROM episodes WHERE address = ? AND finished_at = 0"
        for step in range(count):
            address = first + (start + step) % count
            candidate = str(ipaddress.IPv4Address(address))
            if db.execute(held, (candidate,)).fetchone() is None:
                self._next_address = address + 1
                return candidate
        raise FailedPrecondition(
            f"the sandbox address pool {pool} is exhausted; finish or cancel episodes first"
        )

    def submit(self, spec: EpisodeSpec, request_id: str, address_pool: ipaddress.IPv4Network) -> Episode:
        return self.submit_many([(spec, request_id)], address_pool)[0]

    def submit_many(
        self, submits: Sequence[tuple[EpisodeSpec, str]], address_pool: ipaddress.IPv4Network
    ) -> list[Episode]:
        """Accept episodes durably, all or none. Concurrent calls share one commit (group
        commit), so many submits cost one fsync. A request id seen before returns its episode."""
        encoded = [(spec, records.encode_spec(spec), rid) for spec, rid in submits]

        def insert(db: sqlite3.Connection) -> list[Episode]:
            return [self._insert(db, spec, spec_json, rid, address_pool) for spec, spec_json, rid in encoded]

        return self._database.grouped(insert)

    def _insert(
        self, db: sqlite3.Connection, spec: EpisodeSpec, spec_json: str, request_id: str,
        address_pool: ipaddress.IPv4Network,
    ) -> Episode:  # fmt: skip
        now = time.time()
        if request_id:
            known = self._known_request(db, request_id, "SubmitEpisode", {"spec": spec_json})
            if known is not None:
                return self._get(db, known)
        episode_id = ids.new_episode_id()
        db.execute(
            "INSERT INTO episodes (id, spec, state, reason, priority, labels, address, token, queued_at,"
            " submitted_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                episode_id, spec_json, EpisodeState.PENDING, "submitted", spec.preemption.priority,
                records.encode_labels(spec.labels), self._free_address(db, address_pool),
                ids.new_gateway_token(), now, now, now,
            ),
        )  # fmt: skip
        self._event(db, episode_id, "transition", "", EpisodeState.PENDING, "submitted", "", "")
        if request_id:
            self._store_request(db, request_id, "SubmitEpisode", {"spec": spec_json}, episode_id)
        return self._get(db, episode_id)

    def _get(self, db: sqlite3.Connection, episode_id: str) -> Episode:
        row = db.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        if row is None:
            raise NotFound(f"episode {episode_id!r} does not exist")
        return self._row_to_episode(row)

    def get(self, episode_id: str) -> Episode:
        with self._database.read() as db:
            return self._get(db, episode_id)

    def by_token(self, token: str) -> Episode | None:
        with self._database.read() as db:
            row = db.execute("SELECT * FROM episodes WHERE token = ?", (token,)).fetchone()
            return self._row_to_episode(row) if row else None

    def query(
        self, states: Collection[EpisodeState] = (), node: str = "", labels: Mapping[str, str] | None = None
    ) -> list[Episode]:
        query, args = "SELECT * FROM episodes WHERE 1=1", list[object]()
        if states:
            query += f" AND state IN ({','.join('?' * len(states))})"
            args += [str(s) for s in states]
        if node:
            query += " AND node = ?"
            args.append(node)
        with self._database.read() as db:
            rows = db.execute(query + " ORDER BY submitted_at, id", args).fetchall()
        return records.with_labels([self._row_to_episode(r) for r in rows], labels)

    def _apply(self, db: sqlite3.Connection, episode_id: str, changes: Mapping[str, Any]) -> None:
        if not records.checked_changes(changes):
            return
        values = [
            int(v) if isinstance(v, bool) else json.dumps(v) if isinstance(v, tuple) else v
            for v in changes.values()
        ]
        db.execute(
            f"UPDATE episodes SET {', '.join(f'{k} = ?' for k in changes)} WHERE id = ?",
            (*values, episode_id),
        )

    def transition(
        self,
        episode_id: str,
        to: EpisodeState,
        reason: str,
        *,
        expect: Collection[EpisodeState] = (),
        snapshot: SnapshotRecord | None = None,
        **changes: Any,
    ) -> Episode:
        """Move an episode to `to` if it is in one of `expect`; the change, its event and an
        optional new snapshot record commit together."""
        now = time.time()
        with self._tx() as db:
            current = self._get(db, episode_id)
            columns = records.transition_changes(current, to, reason, expect, snapshot, changes, now)
            if snapshot is not None:
                self._insert_snapshot(db, snapshot)
            self._apply(db, episode_id, columns)
            self._event(
                db, episode_id, "transition", current.state, to, reason, changes.get("node", current.node), ""
            )
            return self._get(db, episode_id)

    def update(self, episode_id: str, *, decision: str = "", **changes: Any) -> Episode:
        """Change fields without a state change; a decision text becomes an event."""
        with self._tx() as db:
            current = self._get(db, episode_id)
            self._apply(db, episode_id, {"updated_at": time.time(), **changes})
            if decision:
                self._event(
                    db, episode_id, "decision", current.state, current.state, decision, current.node, ""
                )
            return self._get(db, episode_id)

    # -- snapshots --------------------------------------------------------------------------

    def _insert_snapshot(self, db: sqlite3.Connection, s: SnapshotRecord) -> None:
        db.execute(
            "INSERT OR IGNORE INTO snapshots VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", records.snapshot_row(s)
        )

    def add_snapshot(self, snapshot: SnapshotRecord, **changes: Any) -> Episode:
        """Record a snapshot that needs no state change (an autosave)."""
        with self._tx() as db:
            current = self._get(db, snapshot.episode_id)
            self._insert_snapshot(db, snapshot)
            self._apply(
                db,
                snapshot.episode_id,
                {
                    "snapshots": current.snapshots + 1,
                    "last_snapshot_id": snapshot.id,
                    "updated_at": time.time(),
                    **changes,
                },
            )
            self._event(
                db, snapshot.episode_id, "decision", current.state, current.state,
                f"{snapshot.reason} snapshot {snapshot.id} stored", snapshot.node, "",
            )  # fmt: skip
            return self._get(db, snapshot.episode_id)

    def snapshots(self, episode_id: str) -> list[SnapshotRecord]:
        with self._database.read() as db:
            rows = db.execute(
                "SELECT * FROM snapshots WHERE episode_id = ? ORDER BY sequence", (episode_id,)
            ).fetchall()
        return [records.snapshot_from_row(dict(r)) for r in rows]

    # -- events -----------------------------------------------------------------------------

    def _event(
        self, db: sqlite3.Connection, episode_id: str, kind: str, from_state: str, to_state: str, reason: str,
        node: str, message: str,
    ) -> None:  # fmt: skip
        caller = current_caller()
        db.execute(
            "INSERT INTO events (episode_id, kind, from_state, to_state, reason, message, node, at, actor)"
            " VALUES (?,?,?,?,?,?,?,?,?)",
            (
                episode_id, kind, str(from_state), str(to_state), reason, message, node, time.time(),
                str(caller) if caller else "",
            ),
        )  # fmt: skip

    def events(self, since_seq: int = 0, episode_ids: Collection[str] = (), limit: int = 1000) -> list[Event]:
        query, args = "SELECT * FROM events WHERE seq > ?", list[object]([since_seq])
        if episode_ids:
            query += f" AND episode_id IN ({','.join('?' * len(episode_ids))})"
            args += list(episode_ids)
        with self._database.read() as db:
            rows = db.execute(query + " ORDER BY seq LIMIT ?", (*args, limit)).fetchall()
        return [Event(**dict(r)) for r in rows]

    @property
    def closed(self) -> bool:
        return self._database.closed

    def wait_for_events(self, since_seq: int, timeout: float) -> bool:
        """Block until an event newer than since_seq exists, the store closes, or timeout passes."""
        with self._changed:
            return self._changed.wait_for(
                lambda: (
                    self.closed
                    or (self._db.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0) > since_seq
                ),
                timeout=timeout,
            )

    # -- nodes ------------------------------------------------------------------------------

    def _row_to_node(self, r: sqlite3.Row) -> NodeRecord:
        return records.node_from_row(dict(r))

    def upsert_node(self, node: NodeRecord) -> NodeRecord:
        """Register or refresh a node. A node that comes back keeps a cordon or drain set on it."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM nodes WHERE name = ?", (node.name,)).fetchone()
            state = node.state
            if row is not None and NodeState(row["state"]) in (NodeState.CORDONED, NodeState.DRAINING):
                state = NodeState(row["state"])
            db.execute(
                "INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?,?,?,?,?)", records.node_row(node, state)
            )
            self._event(db, "", "node", "", str(state), "registered", node.name, node.address)
            return self._row_to_node(
                db.execute("SELECT * FROM nodes WHERE name = ?", (node.name,)).fetchone()
            )

    def update_node_images(self, name: str, images: dict[str, list[str]]) -> None:
        with self._tx() as db:
            db.execute("UPDATE nodes SET images = ? WHERE name = ?", (json.dumps(images), name))

    # -- logs -------------------------------------------------------------------------------

    def put_log(self, episode_id: str, start: int, content: bytes) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO logs VALUES (?,?,?)", (episode_id, start, content))

    def log(self, episode_id: str) -> tuple[int, bytes] | None:
        with self._database.read() as db:
            row = db.execute("SELECT start, content FROM logs WHERE episode_id = ?", (episode_id,)).fetchone()
        return (int(row["start"]), bytes(row["content"])) if row is not None else None

    # -- images -----------------------------------------------------------------------------

    def put_image(self, image: ImageRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO images VALUES (?,?,?,?,?,?)",
                (image.name, image.reference, image.digest, image.size_bytes, image.source, image.created_at),
            )

    def images(self) -> list[ImageRecord]:
        with self._database.read() as db:
            return [ImageRecord(**r) for r in db.execute("SELECT * FROM images ORDER BY name")]

    def image(self, name: str) -> ImageRecord | None:
        with self._database.read() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
        return ImageRecord(**row) if row is not None else None

    def delete_image(self, name: str) -> ImageRecord:
        with self._tx() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
            if row is None:
                known = ", ".join(r["name"] for r in db.execute("SELECT name FROM images")) or "none"
                raise NotFound(f"image {name!r} was not imported; imported images: {known}")
            db.execute("DELETE FROM images WHERE name = ?", (name,))
            return ImageRecord(**row)

    def nodes(self) -> list[NodeRecord]:
        with self._database.read() as db:
            return [self._row_to_node(r) for r in db.execute("SELECT * FROM nodes ORDER BY name")]

    def node(self, name: str) -> NodeRecord:
        with self._database.read() as db:
            row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(n.name for n in self.nodes()) or "none"
            raise NotFound(f"node {name!r} is not registered; known nodes: {known}")
        return self._row_to_node(row)

    def set_node_state(self, name: str, state: NodeState, reason: str) -> NodeRecord:
        with self._tx() as db:
            row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"node {name!r} is not registered")
            if row["state"] != state:
                db.execute("UPDATE nodes SET state = ? WHERE name = ?", (str(state), name))
                self._event(db, "", "node", row["state"], str(state), reason, name, "")
            return self._row_to_node(db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone())

    # -- idempotency ------------------------------------------------------------------------

    def _known_request(
        self, db: sqlite3.Connection, request_id: str, method: str, payload: Mapping[str, Any]
    ) -> str | None:
        records.check_request_id(request_id)
        row = db.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
        return records.check_known_request(request_id, method, payload, dict(row)) if row else None

    def _store_request(
        self, db: sqlite3.Connection, request_id: str, method: str, payload: Mapping[str, Any], target: str
    ) -> None:
        db.execute(
            "INSERT INTO requests VALUES (?,?,?,?,?)",
            (request_id, method, records.fingerprint(method, payload), target, time.time()),
        )

    def known_request(self, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None:
        """The target of an earlier request with this id; Conflict if that request was different."""
        with self._database.read() as db:
            return self._known_request(db, request_id, method, payload)

    def remember_request(self, request_id: str, method: str, payload: Mapping[str, Any], target: str) -> None:
        """Note a state-changing request that succeeded, so a retry of it is not done twice."""
        with self._tx() as db:
            if self._known_request(db, request_id, method, payload) is None:
                self._store_request(db, request_id, method, payload, target)
