"""The state store's logic over any SQL database: episodes, their events, snapshots, nodes, images,
logs and request ids, written once for both stores.

Every state change commits together with its event in one transaction, so a crash at any moment
loses no transition and leaves no change without its reason. Specs are stored as plain data and
read back without validation: they were validated once, when they were submitted.

Statements take `?` placeholders. Each store (`sqlite.py`, `postgres.py`) brings its database's
transactions and the little that differs between dialects: its statements that insert or replace
a row, how it matches a column against many values, and how its submits commit and its watchers
wake.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    Event,
    FailedPrecondition,
    Group,
    ImageRecord,
    InvalidArgument,
    NodeRecord,
    NodeState,
    NotFound,
    SnapshotRecord,
    current_caller,
    ids,
)
from orchestrator.state import records
from orchestrator.state.schema import ON_NODE_SQL, QUEUED_SQL


class Rows(Protocol):
    """What a statement returns: its rows, each readable by column name."""

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection that runs one statement with `?` placeholders."""

    def execute(self, statement: str, args: Sequence[Any] = ..., /) -> Rows: ...


OpenConnection = Callable[[], AbstractContextManager[Connection]]
"""Lends a connection for a `with` block: a write transaction's, or one to read on."""
Grouped = Callable[[Callable[[Any], list[Episode]]], list[Episode]]


def live_run(db: Connection, episode_id: str) -> tuple[int, str]:
    """The episode's current run, and why its trajectory takes no more turns ('' while it does),
    read on `db` inside the caller's write transaction (the trajectory ledger's record of a turn),
    so that no transition can commit between this read and that record."""
    row = db.execute("SELECT state, runs FROM episodes WHERE id = ?", (episode_id,)).fetchone()
    if row is None:
        return 0, f"episode {episode_id} is gone"
    ended = EpisodeState(row["state"]).terminal
    return int(row["runs"]), f"episode {episode_id} has ended ({row['state']})" if ended else ""


class SqlStateStore:
    """The store's logic; a subclass names its database's transactions and dialect."""

    INSERT_SNAPSHOT: ClassVar[str]
    """Insert a `snapshots` row (all columns, in order) unless its id is stored already."""
    REPLACE_NODE: ClassVar[str]
    """Insert a `nodes` row (all columns, in order), overwriting one of the same name."""
    REPLACE_IMAGE: ClassVar[str]
    """Insert an `images` row (all columns, in order), overwriting one of the same name."""
    REPLACE_LOG: ClassVar[str]
    """Insert a `logs` row (all columns, in order), overwriting one of the same episode."""
    QUEUE_TABLE: ClassVar[str] = "episodes"
    """The table `queue` reads, as its database is told to read it through `episodes_queue`."""

    def __init__(self, tx: OpenConnection, read: OpenConnection, grouped: Grouped) -> None:
        self._tx = tx
        """One write transaction; inside it, reads see its own writes."""
        self._read = read
        """A connection for reads, which see every committed transaction."""
        self._grouped = grouped
        """Runs a submit's insert in a write transaction that concurrent submits share, each its
        own savepoint, and returns once it commits (group commit, `grouping.GroupCommit`)."""
        self._next_address = 0

    def _one_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """A condition that `column` is one of `values`, and its arguments."""
        return f"{column} IN ({','.join('?' * len(values))})", list(values)

    def _episode_from_row(self, row: Any) -> Episode:
        return records.episode_from_row(row)

    def _announce_events(self, db: Connection) -> None:
        """Called in every transaction that adds an event, for a store whose watchers are not
        woken by every commit anyway."""

    # -- episodes ---------------------------------------------------------------------------

    def _free_address(self, db: Connection, pool: ipaddress.IPv4Network) -> str:
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
        self,
        submits: Sequence[tuple[EpisodeSpec, str]],
        address_pool: ipaddress.IPv4Network,
        group: Group | None = None,
    ) -> list[Episode]:
        """Accept episodes durably, all or none. A request id seen before returns its episode.
        With a `group`, the submits are its members in index order (`_join_group`)."""
        encoded = [(spec, records.encode_spec(spec), rid) for spec, rid in submits]

        def insert(db: Connection) -> list[Episode]:
            if group is None:
                return [
                    self._insert(db, spec, spec_json, rid, address_pool) for spec, spec_json, rid in encoded
                ]
            self._join_group(db, group, len(encoded))
            return [
                self._insert(db, spec, spec_json, rid, address_pool, group.id, index)
                for index, (spec, spec_json, rid) in enumerate(encoded)
            ]

        return self._grouped(insert)

    def _join_group(self, db: Connection, group: Group, members: int) -> None:
        """Store `group`, or check it against the group of its id stored already (InvalidArgument
        naming the field that differs). Members are submitted all at once: `members` must be the
        group's size."""
        if members != group.size:
            raise InvalidArgument("group.size", f"is {group.size}, but {members} members were submitted")
        row = db.execute("SELECT * FROM episode_groups WHERE id = ?", (group.id,)).fetchone()
        if row is not None:
            group.same_as(records.group_from_row(row))
            return
        db.execute(
            "INSERT INTO episode_groups (id, task_id, size, max_staleness, created_at) VALUES (?,?,?,?,?)",
            (group.id, group.task_id, group.size, group.max_staleness, time.time()),
        )

    def _insert(
        self, db: Connection, spec: EpisodeSpec, spec_json: str, request_id: str,
        address_pool: ipaddress.IPv4Network, group_id: str = "", group_index: int = 0,
    ) -> Episode:  # fmt: skip
        now = time.time()
        payload = {"spec": spec_json, **({"group": f"{group_id}/{group_index}"} if group_id else {})}
        if request_id:
            known = self._known_request(db, request_id, "SubmitEpisode", payload)
            if known is not None:
                return self._get(db, known)
        if group_id:
            taken = db.execute(
                "SELECT id FROM episodes WHERE group_id = ? AND group_index = ?", (group_id, group_index)
            ).fetchone()
            if taken is not None:
                raise InvalidArgument(
                    "group.id", f"group {group_id!r} has its member {group_index} already ({taken['id']});"
                    " a retry must carry the request ids of the first submit"
                )  # fmt: skip
        episode_id = ids.new_episode_id()
        db.execute(
            "INSERT INTO episodes (id, spec, state, reason, priority, labels, address, token, queued_at,"
            " submitted_at, updated_at, group_id, group_index) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                episode_id, spec_json, str(EpisodeState.PENDING), "submitted", spec.preemption.priority,
                records.encode_labels(spec.labels), self._free_address(db, address_pool),
                ids.new_gateway_token(), now, now, now, group_id, group_index,
            ),
        )  # fmt: skip
        self._event(db, episode_id, "transition", "", EpisodeState.PENDING, "submitted", "", "")
        if request_id:
            self._store_request(db, request_id, "SubmitEpisode", payload, episode_id)
        return self._get(db, episode_id)

    def _get(self, db: Connection, episode_id: str) -> Episode:
        row = db.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        if row is None:
            raise NotFound(f"episode {episode_id!r} does not exist")
        return self._episode_from_row(row)

    def get(self, episode_id: str) -> Episode:
        with self._read() as db:
            return self._get(db, episode_id)

    def by_token(self, token: str) -> Episode | None:
        with self._read() as db:
            row = db.execute("SELECT * FROM episodes WHERE token = ?", (token,)).fetchone()
        return self._episode_from_row(row) if row else None

    def query(
        self,
        states: Collection[EpisodeState] = (),
        node: str = "",
        labels: Mapping[str, str] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 0,
    ) -> list[Episode]:
        query, args = "SELECT * FROM episodes WHERE 1=1", list[object]()
        if states:
            condition, values = self._one_of("state", [str(s) for s in states])
            query += f" AND {condition}"
            args += values
        if node:
            query += " AND node = ?"
            args.append(node)
        if after is not None:
            query += " AND (submitted_at, id) > (?, ?)"
            args += after
        query += " ORDER BY submitted_at, id"
        if limit:
            query += " LIMIT ?"
            args.append(limit)
        with self._read() as db:
            rows = db.execute(query, args).fetchall()
        return records.with_labels([self._episode_from_row(r) for r in rows], labels)

    def ended_before(self, moment: float) -> list[str]:
        """The ids of the episodes that ended before `moment`, from the index `episodes_ended`
        alone: their rows, specs and all, are not read."""
        with self._read() as db:
            rows = db.execute(
                "SELECT id FROM episodes WHERE finished_at > 0 AND finished_at < ?", (moment,)
            ).fetchall()
        return [r["id"] for r in rows]

    def snapshot_anchors(self) -> tuple[dict[str, str], list[str]]:
        """What snapshot retention must keep of live episodes: each one's resume point (its
        last recorded snapshot) by episode id, and the snapshots being taken."""
        with self._read() as db:
            rows = db.execute(
                "SELECT id, last_snapshot_id, pending_snapshot_id FROM episodes"
                " WHERE finished_at = 0 AND (last_snapshot_id != '' OR pending_snapshot_id != '')"
            ).fetchall()
        resume = {r["id"]: r["last_snapshot_id"] for r in rows if r["last_snapshot_id"]}
        return resume, [r["pending_snapshot_id"] for r in rows if r["pending_snapshot_id"]]

    def on_nodes(self, node: str = "") -> list[Episode]:
        """The live episodes on a node (on `node` if named), in submission order: placed there,
        running, or being checkpointed or restored. The index `episodes_on_node` holds them: the
        queue and the finished are not read."""
        query, args = f"SELECT * FROM episodes WHERE {ON_NODE_SQL}", list[object]()
        if node:
            query += " AND node = ?"
            args.append(node)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY submitted_at, id", args).fetchall()
        return [self._episode_from_row(r) for r in rows]

    def queue(self, now: float, page: int = 256) -> Iterator[Episode]:
        """The episodes that wait for a slot and may have one now (`Episode.queued`, not held, past
        `not_before`) in the scheduler's order: the highest priority first, then the one that has
        waited longest. Read a page at a time from the index `episodes_queue`, as far as the
        caller reads: a tick of the control loop reads the head of a long queue, not all of it."""
        select = f"SELECT * FROM {self.QUEUE_TABLE} WHERE {QUEUED_SQL} AND not_before <= ?"
        in_order = " ORDER BY priority DESC, queued_at, id LIMIT ?"
        with self._read() as db:
            rows = db.execute(select + in_order, (now, page)).fetchall()
        while rows:
            yield from (self._episode_from_row(r) for r in rows)
            if len(rows) < page:
                return
            # The next page goes on from the last row: the rest of its priority, then the lower
            # ones. Each part is a range of the index, so a page costs the same however far in.
            last = rows[-1]
            with self._read() as db:
                rows = db.execute(
                    select + " AND priority = ? AND (queued_at, id) > (?, ?)" + in_order,
                    (now, last["priority"], last["queued_at"], last["id"], page),
                ).fetchall()
                if len(rows) < page:
                    rows += db.execute(
                        select + " AND priority < ?" + in_order, (now, last["priority"], page - len(rows))
                    ).fetchall()

    def _apply(self, db: Connection, episode_id: str, changes: Mapping[str, Any]) -> None:
        if not records.checked_changes(changes):
            return
        values = [json.dumps(v) if isinstance(v, tuple) else v for v in changes.values()]
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

    def update(
        self, episode_id: str, *, decision: str = "", expect: Collection[EpisodeState] = (), **changes: Any
    ) -> Episode:
        """Change fields without a state change; a decision text becomes an event. With `expect`,
        only in one of those states (checked in the same transaction), else FailedPrecondition."""
        with self._tx() as db:
            current = self._get(db, episode_id)
            if expect and current.state not in expect:
                raise FailedPrecondition(
                    f"episode {episode_id} is {current.state}, not {' or '.join(sorted(expect))}"
                )
            self._apply(db, episode_id, {"updated_at": time.time(), **changes})
            if decision:
                self._event(
                    db, episode_id, "decision", current.state, current.state, decision, current.node, ""
                )
            return self._get(db, episode_id)

    # -- groups -----------------------------------------------------------------------------

    def group(self, group_id: str) -> Group:
        with self._read() as db:
            row = db.execute("SELECT * FROM episode_groups WHERE id = ?", (group_id,)).fetchone()
        if row is None:
            raise NotFound(f"group {group_id!r} does not exist")
        return records.group_from_row(row)

    def groups(self) -> list[Group]:
        """Every group, oldest first."""
        with self._read() as db:
            rows = db.execute("SELECT * FROM episode_groups ORDER BY created_at, id").fetchall()
        return [records.group_from_row(r) for r in rows]

    def members(self, group_id: str) -> list[Episode]:
        """The group's episodes, in index order."""
        with self._read() as db:
            rows = db.execute(
                "SELECT * FROM episodes WHERE group_id = ? ORDER BY group_index", (group_id,)
            ).fetchall()
        return [self._episode_from_row(r) for r in rows]

    # -- snapshots --------------------------------------------------------------------------

    def _insert_snapshot(self, db: Connection, s: SnapshotRecord) -> None:
        db.execute(self.INSERT_SNAPSHOT, records.snapshot_row(s))

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
        with self._read() as db:
            rows = db.execute(
                "SELECT * FROM snapshots WHERE episode_id = ? ORDER BY sequence", (episode_id,)
            ).fetchall()
        return [records.snapshot_from_row(r) for r in rows]

    # -- events -----------------------------------------------------------------------------

    def _event(
        self, db: Connection, episode_id: str, kind: str, from_state: str, to_state: str, reason: str,
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
        self._announce_events(db)

    def events(self, since_seq: int = 0, episode_ids: Collection[str] = (), limit: int = 1000) -> list[Event]:
        query, args = "SELECT * FROM events WHERE seq > ?", list[object]([since_seq])
        if episode_ids:
            condition, values = self._one_of("episode_id", list(episode_ids))
            query += f" AND {condition}"
            args += values
        with self._read() as db:
            rows = db.execute(query + " ORDER BY seq LIMIT ?", (*args, limit)).fetchall()
        return [Event(**r) for r in rows]

    # -- nodes ------------------------------------------------------------------------------

    def upsert_node(self, node: NodeRecord) -> NodeRecord:
        """Register or refresh a node. A node that comes back keeps a cordon or drain set on it."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM nodes WHERE name = ?", (node.name,)).fetchone()
            state = node.state
            if row is not None and NodeState(row["state"]) in (NodeState.CORDONED, NodeState.DRAINING):
                state = NodeState(row["state"])
            db.execute(self.REPLACE_NODE, records.node_row(node, state))
            self._event(db, "", "node", "", str(state), "registered", node.name, node.address)
            return self._node(db, node.name)

    def _node(self, db: Connection, name: str) -> NodeRecord:
        row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"node {name!r} is not registered")
        return records.node_from_row(row)

    def update_node_images(self, name: str, images: dict[str, list[str]]) -> None:
        with self._tx() as db:
            db.execute("UPDATE nodes SET images = ? WHERE name = ?", (json.dumps(images), name))

    def nodes(self) -> list[NodeRecord]:
        with self._read() as db:
            return [records.node_from_row(r) for r in db.execute("SELECT * FROM nodes ORDER BY name")]

    def node(self, name: str) -> NodeRecord:
        with self._read() as db:
            row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(n.name for n in self.nodes()) or "none"
            raise NotFound(f"node {name!r} is not registered; known nodes: {known}")
        return records.node_from_row(row)

    def set_node_state(self, name: str, state: NodeState, reason: str) -> NodeRecord:
        with self._tx() as db:
            current = self._node(db, name)
            if current.state != state:
                db.execute("UPDATE nodes SET state = ? WHERE name = ?", (str(state), name))
                self._event(db, "", "node", str(current.state), str(state), reason, name, "")
            return self._node(db, name)

    # -- logs -------------------------------------------------------------------------------

    def put_log(self, episode_id: str, start: int, content: bytes) -> None:
        with self._tx() as db:
            db.execute(self.REPLACE_LOG, (episode_id, start, content))

    def log(self, episode_id: str) -> tuple[int, bytes] | None:
        with self._read() as db:
            row = db.execute("SELECT start, content FROM logs WHERE episode_id = ?", (episode_id,)).fetchone()
        return (int(row["start"]), bytes(row["content"])) if row is not None else None

    # -- images -----------------------------------------------------------------------------

    def put_image(self, image: ImageRecord) -> None:
        with self._tx() as db:
            db.execute(
                self.REPLACE_IMAGE,
                (image.name, image.reference, image.digest, image.size_bytes, image.source, image.created_at),
            )

    def images(self) -> list[ImageRecord]:
        with self._read() as db:
            return [ImageRecord(**r) for r in db.execute("SELECT * FROM images ORDER BY name")]

    def image(self, name: str) -> ImageRecord | None:
        with self._read() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
        return ImageRecord(**row) if row is not None else None

    def delete_image(self, name: str) -> ImageRecord:
        with self._tx() as db:
            row = db.execute("SELECT * FROM images WHERE name = ?", (name,)).fetchone()
            if row is None:
                known = ", ".join(r["name"] for r in db.execute("SELECT name FROM images ORDER BY name"))
                raise NotFound(f"image {name!r} was not imported; imported images: {known or 'none'}")
            db.execute("DELETE FROM images WHERE name = ?", (name,))
            return ImageRecord(**row)

    # -- idempotency ------------------------------------------------------------------------

    def _known_request(
        self, db: Connection, request_id: str, method: str, payload: Mapping[str, Any]
    ) -> str | None:
        records.check_request_id(request_id)
        row = db.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
        return records.check_known_request(request_id, method, payload, row) if row else None

    def _store_request(
        self, db: Connection, request_id: str, method: str, payload: Mapping[str, Any], target: str
    ) -> None:
        db.execute(
            "INSERT INTO requests VALUES (?,?,?,?,?)",
            (request_id, method, records.fingerprint(method, payload), target, time.time()),
        )

    def known_request(self, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None:
        """The target of an earlier request with this id; Conflict if that request was different."""
        with self._read() as db:
            return self._known_request(db, request_id, method, payload)

    def remember_request(self, request_id: str, method: str, payload: Mapping[str, Any], target: str) -> None:
        """Note a state-changing request that succeeded, so a retry of it is not done twice."""
        with self._tx() as db:
            if self._known_request(db, request_id, method, payload) is None:
                self._store_request(db, request_id, method, payload, target)
