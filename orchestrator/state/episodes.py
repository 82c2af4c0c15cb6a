"""Episodes: submitted all or none, read by id, token, state, node or queue order, and moved
through the state machine. Every change commits together with its event in one transaction, so
a crash at any moment loses no transition and leaves no change without its reason. Specs are
stored as plain data and read back without validation: they were validated once, when submitted.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    Group,
    InvalidArgument,
    Origin,
    SnapshotRecord,
    ids,
)
from orchestrator.state import episode_rows, events, groups, records, requests, snapshots
from orchestrator.state.schema import ON_NODE_SQL, QUEUED_SQL
from orchestrator.state.sql import Connection, Sql


class Episodes(Protocol):
    def submit(self, spec: EpisodeSpec, request_id: str, address_pool: ipaddress.IPv4Network) -> Episode: ...
    def submit_many(
        self,
        submits: Sequence[tuple[EpisodeSpec, str]],
        address_pool: ipaddress.IPv4Network,
        group: Group | None = None,
        origins: Sequence[Origin | None] = (),
    ) -> list[Episode]:
        """All of them, durably, or none; with `group`, they are its members in index order.
        `origins`, one per submit if given, makes those with one fork children: PREEMPTED from
        the start, to restore their origin's snapshot."""

    def get(self, episode_id: str) -> Episode: ...
    def by_token(self, token: str) -> Episode | None: ...
    def keyed_by(self, episode_id: str) -> list[Episode]:
        """The live fork children whose harnesses hold `episode_id`'s gateway key (`key_of`)."""

    def query(
        self,
        states: Collection[EpisodeState] = (),
        node: str = "",
        labels: Mapping[str, str] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 0,
    ) -> list[Episode]:
        """Episodes in submission order: in one of `states`, on `node`, past `after` (an episode's
        submitted_at and id). `limit` bounds the rows read, before `labels` (all of which an
        episode must carry) are matched."""

    def ended_before(self, moment: float) -> list[str]:
        """The ids of the episodes that ended before `moment`."""

    def on_nodes(self, node: str = "") -> list[Episode]:
        """The live episodes on a node (on `node` if named), in submission order."""

    def queue(self, now: float, page: int = 256) -> Iterator[Episode]:
        """The episodes that wait for a slot and may have one now, in the scheduler's order."""

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

    def update(
        self, episode_id: str, *, decision: str = "", expect: Collection[EpisodeState] = (), **changes: Any
    ) -> Episode:
        """Change fields without a state change; a decision text becomes an event. With `expect`,
        only in one of those states (checked in the same transaction), else FailedPrecondition."""


class SqlEpisodes:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql
        self._next_address = 0

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
        origins: Sequence[Origin | None] = (),
    ) -> list[Episode]:
        """Accept episodes durably, all or none. A request id seen before returns its episode.
        With a `group`, the submits are its members in index order (`groups.join`)."""
        encoded = [(spec, records.encode_spec(spec), rid) for spec, rid in submits]
        starts = list(origins) or [None] * len(encoded)

        def insert(db: Connection) -> list[Episode]:
            if group is not None:
                groups.join(db, group, len(encoded))
            return [
                self._insert(db, spec, spec_json, rid, address_pool, group, index, origin)
                for index, ((spec, spec_json, rid), origin) in enumerate(zip(encoded, starts, strict=True))
            ]

        return self._sql.grouped(insert)

    def _insert(
        self, db: Connection, spec: EpisodeSpec, spec_json: str, request_id: str,
        address_pool: ipaddress.IPv4Network, group: Group | None, group_index: int, origin: Origin | None,
    ) -> Episode:  # fmt: skip
        now = time.time()
        group_id = group.id if group is not None else ""
        group_index = group_index if group is not None else 0
        payload = {
            "spec": spec_json,
            **({"group": f"{group_id}/{group_index}"} if group_id else {}),
            **({"origin": f"{origin.snapshot_id}/{origin.index}"} if origin else {}),
        }
        if request_id:
            known = requests.known(db, request_id, "SubmitEpisode", payload)
            if known is not None:
                return episode_rows.fetch(self._sql, db, known)
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
        state, reason = EpisodeState.PENDING, "submitted"
        if origin is not None:  # a fork child waits, as a preempted episode does, for its restore
            state = EpisodeState.PREEMPTED
            reason = f"forked from snapshot {origin.snapshot_id} of {origin.parent.id} (child {origin.index})"
        db.execute(
            "INSERT INTO episodes (id, spec, state, reason, priority, labels, address, token, queued_at,"
            " submitted_at, updated_at, group_id, group_index, last_snapshot_id, forked_from, fork_parent,"
            " fork_index, key_of) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                episode_id, spec_json, str(state), reason, spec.preemption.priority,
                records.encode_labels(spec.labels), self._free_address(db, address_pool),
                ids.new_gateway_token(), now, now, now, group_id, group_index,
                *((origin.snapshot_id, origin.snapshot_id, origin.parent.id, origin.index, origin.key_of)
                  if origin else ("", "", "", 0, "")),
            ),
        )  # fmt: skip
        events.record(self._sql, db, episode_id, "transition", "", state, reason, "", "")
        if request_id:
            requests.remember(db, request_id, "SubmitEpisode", payload, episode_id)
        return episode_rows.fetch(self._sql, db, episode_id)

    def get(self, episode_id: str) -> Episode:
        with self._sql.read() as db:
            return episode_rows.fetch(self._sql, db, episode_id)

    def by_token(self, token: str) -> Episode | None:
        with self._sql.read() as db:
            row = db.execute("SELECT * FROM episodes WHERE token = ?", (token,)).fetchone()
        return self._sql.dialect.episode(row) if row else None

    def keyed_by(self, episode_id: str) -> list[Episode]:
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT * FROM episodes WHERE key_of = ? AND finished_at = 0 ORDER BY id", (episode_id,)
            ).fetchall()
        return [self._sql.dialect.episode(r) for r in rows]

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
            condition, values = self._sql.dialect.one_of("state", [str(s) for s in states])
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
        with self._sql.read() as db:
            rows = db.execute(query, args).fetchall()
        return records.with_labels([self._sql.dialect.episode(r) for r in rows], labels)

    def ended_before(self, moment: float) -> list[str]:
        """From the index `episodes_ended` alone: their rows, specs and all, are not read."""
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT id FROM episodes WHERE finished_at > 0 AND finished_at < ?", (moment,)
            ).fetchall()
        return [r["id"] for r in rows]

    def on_nodes(self, node: str = "") -> list[Episode]:
        """Placed there, running, or being checkpointed or restored. The index `episodes_on_node`
        holds them: the queue and the finished are not read."""
        query, args = f"SELECT * FROM episodes WHERE {ON_NODE_SQL}", list[object]()
        if node:
            query += " AND node = ?"
            args.append(node)
        with self._sql.read() as db:
            rows = db.execute(query + " ORDER BY submitted_at, id", args).fetchall()
        return [self._sql.dialect.episode(r) for r in rows]

    def queue(self, now: float, page: int = 256) -> Iterator[Episode]:
        """`Episode.queued`, not held, past `not_before`; the highest priority first, then the one
        that has waited longest. Read a page at a time from the index `episodes_queue`, as far as
        the caller reads: a tick of the control loop reads the head of a long queue, not all of it."""
        select = f"SELECT * FROM {self._sql.dialect.queue_table} WHERE {QUEUED_SQL} AND not_before <= ?"
        in_order = " ORDER BY priority DESC, queued_at, id LIMIT ?"
        with self._sql.read() as db:
            rows = db.execute(select + in_order, (now, page)).fetchall()
        while rows:
            yield from (self._sql.dialect.episode(r) for r in rows)
            if len(rows) < page:
                return
            # The next page goes on from the last row: the rest of its priority, then the lower
            # ones. Each part is a range of the index, so a page costs the same however far in.
            last = rows[-1]
            with self._sql.read() as db:
                rows = db.execute(
                    select + " AND priority = ? AND (queued_at, id) > (?, ?)" + in_order,
                    (now, last["priority"], last["queued_at"], last["id"], page),
                ).fetchall()
                if len(rows) < page:
                    rows += db.execute(
                        select + " AND priority < ?" + in_order, (now, last["priority"], page - len(rows))
                    ).fetchall()

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
        now = time.time()
        with self._sql.tx() as db:
            current = episode_rows.fetch(self._sql, db, episode_id)
            columns = records.transition_changes(current, to, reason, expect, snapshot, changes, now)
            if snapshot is not None:
                snapshots.insert(self._sql, db, snapshot)
            episode_rows.apply(db, episode_id, columns)
            events.record(
                self._sql, db, episode_id, "transition", current.state, to, reason,
                changes.get("node", current.node), "",
            )  # fmt: skip
            return episode_rows.fetch(self._sql, db, episode_id)

    def update(
        self, episode_id: str, *, decision: str = "", expect: Collection[EpisodeState] = (), **changes: Any
    ) -> Episode:
        with self._sql.tx() as db:
            current = episode_rows.fetch(self._sql, db, episode_id)
            if expect and current.state not in expect:
                raise FailedPrecondition(
                    f"episode {episode_id} is {current.state}, not {' or '.join(sorted(expect))}"
                )
            episode_rows.apply(db, episode_id, {"updated_at": time.time(), **changes})
            if decision:
                events.record(
                    self._sql,
                    db,
                    episode_id,
                    "decision",
                    current.state,
                    current.state,
                    decision,
                    current.node,
                    "",
                )
            return episode_rows.fetch(self._sql, db, episode_id)
