"""The trajectory ledger: every model turn of every episode, recorded before its response is
delivered, as a tree that survives preemption exactly once.

Matching rule (also in docs/trajectory.md). A request is reduced to its canonical form (see
`canonical`). A request whose canonical form equals a recorded turn's that its run was never
answered with (recorded in an earlier run and not delivered to this one since, or never delivered
to its end) is answered from the ledger with the bytes recorded for the harness (a replay).
Otherwise it is sampled fresh, a sibling of any identical turn, and its
parent is the recorded turn whose conversation (its messages plus its answer) is the longest
prefix of the request's messages. If that parent already has a child from an earlier run that
the restored sandbox never had (it was not delivered before the snapshot froze the sandbox, nor
delivered again since), the restored harness has diverged: that child and its descendants are
marked abandoned and the new turn continues the parent's branch. Other children are parallel
calls, subagents or compactions, and stay live on branches of their own. A completion request is
matched the same way with its prompt text as the conversation.

A fork child's trajectory begins with its parent's turns up to the fork's snapshot's cursor,
shared, not copied (`forks`): a child's request may continue one of them (its first turn hangs
from it by a `fork` edge), but is never answered from them, nor from a sibling's turns: each
child samples its own.

`Ledger` matches, records and notes deliveries; the turns it returns are `turns`' records, read
from their rows by `_rows`, and a new turn's place in the tree is worked out by `_tree`. Beside
the turns, in the same database: `ledger.policy` (`policy`), `ledger.outages` (`outages`) and
`ledger.verifications` (`verifications`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.domain import Conflict, FailedPrecondition, StandingBy
from orchestrator.state.database import Database
from orchestrator.state.postgres_database import PostgresDatabase
from orchestrator.state.sql import Connection, SqlDatabase
from orchestrator.trajectory import _tree, forks, schema
from orchestrator.trajectory._rows import BUT_BODIES, TurnRows, packed
from orchestrator.trajectory.canonical import CanonicalRequest
from orchestrator.trajectory.forks import ForkOrigin, Scope
from orchestrator.trajectory.outages import Outages
from orchestrator.trajectory.policy import PolicyVersions
from orchestrator.trajectory.turns import PLAIN, Branch, Lineage, Sampling, Turn, extension
from orchestrator.trajectory.verifications import Verifications

T = TypeVar("T")

MAX_FORK_DEPTH = 1000
"""The most fork generations a trajectory is followed back through."""
MAX_SCOPES_HELD = 100_000
"""How many episodes' scopes (`scope`) are held in memory at most."""


class Ledger:
    """Durable turns: in SQLite, the state dir's file on a connection of its own (WAL, fsync on
    every commit), or in the PostgreSQL state store's database, where every orchestrator on that
    database finds every turn. Record before deliver: a turn's commit is durable before its
    response leaves."""

    def __init__(
        self, database: SqlDatabase, *, owned: bool, origins: Callable[[str], ForkOrigin | None] | None = None
    ) -> None:
        """A ledger on a database that has its tables; `close` closes it only if `owned`.
        `origins` says where an episode was forked from (None: it was not), as the state store
        has it; the ledger asks once per episode, and keeps a fork's origin itself."""
        self._database = database
        self._origins = origins or (lambda episode_id: None)
        self._scopes: dict[str, Scope] = {}
        self._scopes_lock = threading.Lock()
        self._owned = owned
        self._tx = database.tx
        self._read = database.read
        self._rows = TurnRows()
        self.policy = PolicyVersions(database)
        """The policy versions a trainer published, in the same database."""
        self.outages = Outages(database)
        """The runs the model server failed, in the same database."""
        self.verifications = Verifications(database)
        """What each episode's verifier found, in the same database."""

    @classmethod
    def sqlite(cls, path: Path, origins: Callable[[str], ForkOrigin | None] | None = None) -> Ledger:
        """A ledger of its own on the SQLite file at `path`."""
        database = Database(path, "")
        present = {
            table: {r["name"] for r in database.db.execute(f"PRAGMA table_info({table})")}
            for table in schema.ADDED
        }
        columns = present["turns"]
        if columns and "delivered" not in columns:  # checked first: the new indexes need new columns
            database.close()
            raise FailedPrecondition(
                f"{path} holds a trajectory ledger from an older Stasis; start with a new state dir"
            )
        for statement in schema.added_columns(present):
            database.db.execute(statement)
        database.db.executescript(schema.SQLITE)
        return cls(database, owned=True, origins=origins)

    @classmethod
    def postgres(
        cls, database: PostgresDatabase, origins: Callable[[str], ForkOrigin | None] | None = None
    ) -> Ledger:
        """A ledger in the PostgreSQL state store's database, beside the store's tables, on its
        pool; the store closes it."""
        database.create(schema.POSTGRES + schema.POSTGRES_ADDED)
        return cls(database, owned=False, origins=origins)

    def close(self) -> None:
        if self._owned:
            self._database.close()

    # -- forks -------------------------------------------------------------------------------

    def scope(self, episode_id: str) -> Scope:
        """The turns the episode's trajectory holds: its own, and a fork child's ancestors' up to
        the cursor of the snapshot each was forked from (`forks`)."""
        with self._scopes_lock:
            known = self._scopes.get(episode_id)
        if known is not None:
            return known
        lineage: list[tuple[str, ForkOrigin]] = []
        at = episode_id
        while (origin := self._origin(at)) is not None and len(lineage) < MAX_FORK_DEPTH:
            lineage.append((at, origin))
            at = origin.parent
        scope = forks.own(at)
        for child, origin in reversed(lineage):  # the first of the line first
            scope = forks.own(child).under(origin, scope)
        with self._scopes_lock:
            if len(self._scopes) >= MAX_SCOPES_HELD:  # read again as needed: a scope never changes
                self._scopes.clear()
            self._scopes[episode_id] = scope
        return scope

    def _origin(self, episode_id: str) -> ForkOrigin | None:
        """Where the episode was forked from: as the ledger keeps it, else as `origins` says
        (kept from then on, so that it outlives the snapshot)."""
        with self._read() as db:
            row = db.execute(
                "SELECT parent, snapshot_id, cursor FROM fork_origins WHERE episode_id = ?", (episode_id,)
            ).fetchone()
        if row is not None:
            return ForkOrigin(row["parent"], row["snapshot_id"], int(row["cursor"]))
        origin = self._origins(episode_id)
        if origin is None:
            return None
        if origin.parent == episode_id or origin.cursor < 0:
            raise ValueError(f"episode {episode_id}: {origin} is no fork origin")
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO fork_origins (episode_id, parent, snapshot_id, cursor) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (episode_id) DO NOTHING",
                    (episode_id, origin.parent, origin.snapshot_id, origin.cursor),
                )
        except StandingBy:  # a standby reads trajectories and writes nothing: the leader keeps it
            pass
        return origin

    # -- matching ----------------------------------------------------------------------------

    def find(self, episode_id: str, request: CanonicalRequest, run: int | None = None) -> Turn | None:
        """The first live recorded turn with this exact request (a read, no commit). Given `run`,
        only one that run has not been answered with: recorded in an earlier run and not delivered
        to this one since, or recorded in it and never delivered to its end (the matching rule's
        replay)."""
        unanswered = "" if run is None else " AND NOT (delivered_run >= ? AND delivered_at IS NOT NULL)"
        with self._read() as db:
            row = db.execute(
                "SELECT * FROM turns WHERE episode_id = ? AND fingerprint = ? AND abandoned = 0"
                f"{unanswered} ORDER BY id LIMIT 1",
                (episode_id, request.fingerprint, *(() if run is None else (run,))),
            ).fetchone()
            return self._rows.turn(db, row) if row is not None else None

    def parent(self, episode_id: str, request: CanonicalRequest) -> Turn | None:
        """The recorded turn this request continues: the one whose conversation (its request plus
        its answer) is the longest proper prefix of the request's (a read, no commit); in a fork
        child, one of its own or one its trajectory shares. Its bodies (request, response,
        delivery) are not read: they are megabytes in a long conversation."""
        scope = self.scope(episode_id)
        with self._read() as db:
            return self._parent(db, scope, request)

    def _parent(self, db: Connection, scope: Scope, request: CanonicalRequest) -> Turn | None:
        within, params = scope.where()
        lengths: list[int] = []
        if request.kind == "completion":
            lengths = [r["after_len"] for r in db.execute(
                f"SELECT DISTINCT after_len FROM turns WHERE {within} AND kind = ?", (*params, request.kind)
            )]  # fmt: skip
        hashes = request.prefix_hashes(lengths)
        if not hashes:
            return None
        row = db.execute(
            f"SELECT {BUT_BODIES} FROM turns WHERE {within} AND after_hash IN ({','.join('?' * len(hashes))})"
            " ORDER BY after_len DESC, abandoned, id DESC LIMIT 1",
            (*params, *hashes),
        ).fetchone()
        return self._rows.turn(db, row) if row is not None else None

    def replay(self, episode_id: str, run: int, request: CanonicalRequest) -> Turn | None:
        """The turn a request of `run` is answered with from the ledger (`find`), its replay
        noted as delivered."""
        with self._tx():
            turn = self.find(episode_id, request, run)
            if turn is not None:
                self.replayed(turn.id, run)
            return turn

    # -- recording ---------------------------------------------------------------------------

    def record(
        self,
        episode_id: str,
        run: int,
        resumed_at: float,
        request: CanonicalRequest,
        request_raw: bytes,
        answer: Any,
        response: bytes,
        protocol: str,
        delivered: bytes,
        token_ids: list[int],
        logprobs: list[float],
        prompt_token_ids: list[int],
        policy_version: str,
        upstream_ms: float,
        *,
        lineage: Lineage | None = None,
        mode: str = "text",
        finish_reason: str = "",
        sampling: Sampling = PLAIN,
        logprobs_mode: str = "",
        tools_key: str = "",
        live_run: Callable[[Connection], tuple[int, str]] | None = None,
        sending: bool = False,
        spawns: Sequence[str] = (),
    ) -> Turn:
        """Commit a freshly sampled turn, placing it in the tree (see the module docstring).

        `live_run` is asked first, inside the transaction: the episode's current run, and why its
        trajectory takes no more turns. An episode that ended refuses the turn (Conflict). A turn
        sampled for a run that a later one replaced while it generated (its node was lost, or it
        was preempted and restored) is recorded abandoned if the later run already went its own
        way from the same parent, as it would be were the later turn recorded after it: the tree
        does not depend on which commits first.

        `lineage` names the parent the prompt was built on and how the prompt extends it; without
        one the parent is looked up here and the prompt ids checked against it (text mode).
        `resumed_at` is when the snapshot the current run was restored from froze the sandbox
        (0 for a run started afresh): a sibling from an earlier run is stale unless its delivery
        had finished by then, or it was delivered again to this run. A sibling whose delivery was
        under way when the orchestrator stopped (`sending`) counts as had if that began before.

        `sending`: the turn's delivery begins as soon as it is recorded (`Ledger.sending`, in the
        same commit). `spawns`: the `prompt` arguments of its tool calls (`edges.spawns`), which
        link a subagent to it.
        """
        scope = self.scope(episode_id)
        with self._tx() as db:
            current = run
            if live_run is not None:
                current, ended = live_run(db)
                if ended:
                    raise Conflict(ended)
            if lineage is None:
                lineage = extension(self._parent(db, scope, request), prompt_token_ids)
            place = _tree.place(db, scope, run, current, resumed_at, lineage, request)
            parent_id = lineage.parent_id
            after_hash, after_len = request.after(answer)
            now = time.time()
            exact = None if lineage.prefix_exact is None else int(lineage.prefix_exact)
            # A prompt that extends its parent's tokens is stored as what it adds to them.
            base = lineage.common_prefix if lineage.prefix_exact and parent_id is not None else 0
            inserted = db.execute(
                "INSERT INTO turns (episode_id, parent_id, branch, run, kind, fingerprint, after_hash, after_len,"
                " request, request_raw, answer, response, protocol, delivered, delivered_run, token_ids, logprobs,"
                " prompt_token_ids, policy_version, upstream_ms, created_at, mode, prefix_exact, common_prefix,"
                " break_reason, finish_reason, sampling, logprobs_mode, tools_key, prompt_base, abandoned,"
                " sending_run, sending_at, edge, edge_parent, spawns)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
                (
                    episode_id, parent_id, place.branch, run, request.kind, request.fingerprint, after_hash, after_len,
                    json.dumps({"params": request.params, "size": request.size}), packed(request_raw),
                    json.dumps(answer), response, protocol, delivered, run, json.dumps(token_ids), json.dumps(logprobs),
                    json.dumps(prompt_token_ids[base:]), policy_version, upstream_ms, now, mode, exact,
                    lineage.common_prefix, lineage.break_reason, finish_reason, json.dumps(dataclasses.asdict(sampling)),
                    logprobs_mode, tools_key, base, int(place.abandoned), run if sending else 0, now if sending else None,
                    place.edge.value, place.edge_parent, json.dumps(list(spawns)),
                ),
            ).fetchone()  # fmt: skip
            self._rows.hold(inserted["id"], prompt_token_ids + token_ids)
            return Turn(
                id=inserted["id"], episode_id=episode_id, parent_id=parent_id, branch=place.branch, run=run,
                kind=request.kind, request_raw=request_raw, response=response, protocol=protocol,
                delivered=delivered, delivered_run=run, delivered_at=None, token_ids=token_ids, logprobs=logprobs,
                prompt_token_ids=prompt_token_ids, policy_version=policy_version, abandoned=place.abandoned, replays=0,
                created_at=now, after_len=after_len, mode=mode, lineage=lineage, finish_reason=finish_reason,
                sampling=sampling, logprobs_mode=logprobs_mode, tools_key=tools_key, upstream_ms=upstream_ms,
                sending_run=run if sending else 0, sending_at=now if sending else None, edge=place.edge.value,
                edge_parent=place.edge_parent,
            )  # fmt: skip

    def batch(self, ops: Sequence[Callable[[], T]]) -> list[tuple[bool, T | Exception]]:
        """Run ledger calls in one transaction, so they share one fsync (group commit). Each runs
        in a savepoint: one that fails is undone alone and returns (False, its error)."""
        results: list[tuple[bool, T | Exception]] = []
        with self._tx():
            for op in ops:
                try:
                    results.append((True, op()))
                except Exception as exc:
                    results.append((False, exc))
        return results

    # -- delivery notes ----------------------------------------------------------------------

    def sending(self, turn_id: int, run: int, at: float) -> None:
        """Note, before the last part of a delivery to `run` goes out, that it is under way: if
        the orchestrator stops before the delivery is seen to end, the turn reads as one the
        harness may have had from `at` (delivery uncertain), never as one it cannot have."""
        with self._tx() as db:
            db.execute("UPDATE turns SET sending_run = ?, sending_at = ? WHERE id = ?", (run, at, turn_id))

    def delivered(self, turn_id: int, at: float, run: int = 0, *, replay: bool = False) -> None:
        """Note that a delivery of the turn to `run` reached its end at `at` (a stream's terminal
        event included); `replay`: it was served again from the ledger."""
        with self._tx() as db:
            db.execute(
                "UPDATE turns SET delivered_at = ?, replays = replays + ?, sending_run = 0, sending_at = NULL,"
                " delivered_run = CASE WHEN delivered_run < ? THEN ? ELSE delivered_run END WHERE id = ?",
                (at, int(replay), run, run, turn_id),
            )

    def unsent(self, turn_id: int) -> None:
        """Note that the delivery under way failed: the harness never had its end."""
        with self._tx() as db:
            db.execute("UPDATE turns SET sending_run = 0, sending_at = NULL WHERE id = ?", (turn_id,))

    def replayed(self, turn_id: int, run: int, at: float | None = None) -> None:
        """Note that a replay of the turn to `run` reached its end (now, unless `at`)."""
        self.delivered(turn_id, time.time() if at is None else at, run, replay=True)

    # -- the tree ----------------------------------------------------------------------------

    def cursor(self, episode_id: str) -> dict[str, int]:
        """The ledger position a snapshot records: every turn up to `turn` happened before it."""
        with self._read() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(id), 0) AS turn, COUNT(*) AS turns FROM turns WHERE episode_id = ?",
                (episode_id,),
            ).fetchone()
        return {"turn": int(row["turn"]), "turns": int(row["turns"])}

    def turns(self, episode_id: str) -> list[Turn]:
        """The episode's turns in id order; a fork child's begin with those it shares with its
        ancestors (`Turn.shared`, `forks.shared_view`)."""
        scope = self.scope(episode_id)
        within, params = scope.where()
        with self._read() as db:
            rows = db.execute(f"SELECT * FROM turns WHERE {within} ORDER BY id", params).fetchall()
            out: list[Turn] = []
            sequences: dict[int, list[int]] = {}
            for r in rows:  # a parent's id is below its children's
                turn = self._rows.turn(db, r, sequences)
                sequences[turn.id] = turn.prompt_token_ids + turn.token_ids
                out.append(turn)
        return forks.shared_view(episode_id, out) if scope.forked else out

    def branches(self, episode_id: str) -> list[Branch]:
        """Every branch with its turns; branch 0 is the main one. A fork child's hold the turns
        it shares with its parent (`Turn.shared`), with their branch numbers."""
        by_branch: dict[int, list[Turn]] = {}
        for t in self.turns(episode_id):
            by_branch.setdefault(t.branch, []).append(t)
        return [Branch(b, turns, all(t.abandoned for t in turns)) for b, turns in sorted(by_branch.items())]

    # -- rewards ----------------------------------------------------------------------------
    def live_versions(self, episode_id: str) -> list[str]:
        """The policy versions of the episode's live turns, each once: what a group's
        `max_staleness` is compared with (`policy.beyond_bound`)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT DISTINCT policy_version FROM turns WHERE episode_id = ? AND abandoned = 0",
                (episode_id,),
            ).fetchall()
        return [str(r["policy_version"]) for r in rows]

    def start_over(self, episode_id: str) -> int:
        """Abandon every live turn of an episode that runs again from the start, so that its new
        run's requests are sampled afresh, never replayed from these; they move past every branch
        number, so that the new run's primary conversation is main (branch 0) again. How many."""
        scope = self.scope(episode_id)
        with self._tx() as db:
            live = db.execute(
                "SELECT COUNT(*) AS n FROM turns WHERE episode_id = ? AND abandoned = 0", (episode_id,)
            ).fetchone()
            db.execute(
                "UPDATE turns SET abandoned = 1, branch = branch + ? WHERE episode_id = ? AND abandoned = 0",
                (_tree.next_branch_of(db, scope), episode_id),
            )
            return int(live["n"])
