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
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import zstandard

from orchestrator.domain import Conflict, FailedPrecondition
from orchestrator.state.database import Database
from orchestrator.state.postgres_database import PostgresDatabase
from orchestrator.state.sql import Connection, SqlDatabase
from orchestrator.trajectory import edges, schema
from orchestrator.trajectory.canonical import CanonicalRequest
from orchestrator.trajectory.policy import PolicyVersions

T = TypeVar("T")


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a turn's tokens were drawn with, as the gateway asked for them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k cut."""
    max_tokens: int = 0
    """The turn's limit (0: the upstream's); not part of what decides a token's distribution."""

    @property
    def distribution(self) -> tuple[float, float, int]:
        """What decides the distribution a token is drawn from."""
        return self.temperature, self.top_p, max(self.top_k, 0)

    @property
    def plain(self) -> bool:
        """Temperature 1, no top-p, no top-k: raw and processed log-probs are the same."""
        return self.distribution == (1.0, 1.0, 0)


@dataclass(frozen=True)
class Lineage:
    """How a turn's prompt stands to its parent's tokens."""

    parent_id: int | None
    prefix_exact: bool | None
    """The prompt begins with the parent's prompt ids plus its sampled ids; True for a root (no
    parent), None when the upstream gave no prompt ids to check."""
    common_prefix: int = 0
    """How many leading tokens the prompt shares with the parent's prompt plus sampled ids."""
    break_reason: str = ""
    """Why the prompt does not extend the parent's tokens, when it does not."""


ROOT = Lineage(None, True)


@dataclass(frozen=True)
class Turn:
    id: int
    episode_id: str
    parent_id: int | None
    branch: int
    run: int
    kind: str
    request_raw: bytes
    """The harness's request body as it arrived."""
    response: bytes
    """The upstream's response as it arrived (its server-sent events, when streamed)."""
    protocol: str
    delivered: bytes
    """The exact bytes the harness gets in its own protocol; a replay sends them again."""
    delivered_run: int
    """The latest run of the sandbox a delivery of this turn reached its end in: the run that
    asked for it until then, a replay's run once the replay is out."""
    delivered_at: float | None
    """When the last part of the last delivery that reached its end was about to go out; None
    while none has."""
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int]
    policy_version: str
    abandoned: bool
    replays: int
    created_at: float
    after_len: int = 0
    """The length of the conversation once this turn's answer is appended: messages (chat) or
    characters (completion)."""
    mode: str = "text"
    """tokens: the gateway built the prompt as ids and parsed the sampled ids itself; text: the
    upstream rendered the messages and parsed its own answer."""
    lineage: Lineage = ROOT
    finish_reason: str = ""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    logprobs_mode: str = ""
    """What the upstream's log-probs were found to be of when this turn was sampled: processed
    (the sampling distribution), raw (before temperature and top-p), or "" (not known)."""
    tools_key: str = ""
    """Digest of the tools the prompt lists: a prompt can extend the parent's tokens only if equal."""
    upstream_ms: float = 0.0
    """How long the upstream took to answer (to its last event, when streamed)."""
    sending_run: int = 0
    """A delivery to this run was under way (its last part about to go out) and has not been
    seen to end either way; 0 when none is. Noted durably before that part leaves, so a turn the
    harness may have is never read as one it cannot have (`Ledger.sending`)."""
    sending_at: float | None = None
    """When that delivery's last part was about to go out."""
    edge: str = ""
    """How the turn hangs in the tree (`edges.Edge`); "" for a turn recorded before edges were."""
    edge_parent: int | None = None
    """The turn it hangs from: its parent, the turn whose tool call spawned a subagent, the
    compaction a conversation continues from; None for a root, a side call, an unlinked subagent."""

    @property
    def delivery_uncertain(self) -> bool:
        """A delivery was under way when the orchestrator stopped: the harness may have the turn."""
        return self.sending_run > 0

    @property
    def prefix_exact(self) -> bool | None:
        return self.lineage.prefix_exact

    @property
    def logprobs_exact(self) -> bool:
        """The recorded log-probs are of the distribution each token was drawn from."""
        return self.logprobs_mode == "processed" or self.sampling.plain


@dataclass
class Branch:
    id: int
    turns: list[Turn]
    abandoned: bool

    @property
    def edge(self) -> str:
        """What the branch is: its first turn's edge."""
        return self.turns[0].edge if self.turns else ""


@dataclass
class Verification:
    reward: float | None
    exit_code: int | None
    timed_out: bool
    log: bytes
    duration_ms: float


_BUT_BODIES = ", ".join(
    c for c in schema.TURN_COLUMNS if c not in ("request_raw", "response", "delivered", "request", "answer")
)
"""A turn's columns but its bodies (megabytes for a long conversation): what finding one needs."""


class _Sequences:
    """The prompt plus sampled ids of recently recorded or read turns, which the next turns of
    their episodes are built on, up to `budget` tokens in all (least recently used go first)."""

    def __init__(self, budget: int = 16 << 20) -> None:
        self._budget = budget
        self._held = 0
        self._by_turn: OrderedDict[int, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, turn_id: int) -> list[int] | None:
        with self._lock:
            seq = self._by_turn.get(turn_id)
            if seq is not None:
                self._by_turn.move_to_end(turn_id)
            return seq

    def put(self, turn_id: int, seq: list[int]) -> None:
        with self._lock:
            old = self._by_turn.pop(turn_id, None)
            self._held += len(seq) - (len(old) if old is not None else 0)
            self._by_turn[turn_id] = seq
            while self._held > self._budget and len(self._by_turn) > 1:
                _, dropped = self._by_turn.popitem(last=False)
                self._held -= len(dropped)


class Ledger:
    """Durable turns: in SQLite, the state dir's file on a connection of its own (WAL, fsync on
    every commit), or in the PostgreSQL state store's database, where every orchestrator on that
    database finds every turn. Record before deliver: a turn's commit is durable before its
    response leaves."""

    def __init__(self, database: SqlDatabase, *, owned: bool) -> None:
        """A ledger on a database that has its tables; `close` closes it only if `owned`."""
        self._database = database
        self._owned = owned
        self._tx = database.tx
        self._read = database.read
        self._sequences = _Sequences()
        self.policy = PolicyVersions(database)
        """The policy versions a trainer published, in the same database."""

    @classmethod
    def sqlite(cls, path: Path) -> Ledger:
        """A ledger of its own on the SQLite file at `path`."""
        database = Database(path, "")
        columns = {r["name"] for r in database.db.execute("PRAGMA table_info(turns)")}
        if columns and "delivered" not in columns:  # checked first: the new indexes need new columns
            database.close()
            raise FailedPrecondition(
                f"{path} holds a trajectory ledger from an older Stasis; start with a new state dir"
            )
        for statement in schema.added_columns(columns, "INTEGER") if columns else ():
            database.db.execute(statement)
        database.db.executescript(schema.SQLITE)
        return cls(database, owned=True)

    @classmethod
    def postgres(cls, database: PostgresDatabase) -> Ledger:
        """A ledger in the PostgreSQL state store's database, beside the store's tables, on its
        pool; the store closes it."""
        database.create(schema.POSTGRES + schema.POSTGRES_ADDED)
        return cls(database, owned=False)

    def close(self) -> None:
        if self._owned:
            self._database.close()

    def _turn(self, db: Connection, r: Any, prompts: Mapping[int, list[int]] | None = None) -> Turn:
        """A turn from its row; its prompt is rebuilt from its parent's tokens where it stores only
        what they do not hold (`prompts`: tokens of the turns read with it)."""
        keys = r.keys()
        base, tail = r["prompt_base"], json.loads(r["prompt_token_ids"])
        if base:
            parent = (prompts or {}).get(r["parent_id"])
            if parent is None:
                parent = self._sequence(db, r["parent_id"])
            tail = parent[:base] + tail
        return Turn(
            id=r["id"],
            episode_id=r["episode_id"],
            parent_id=r["parent_id"],
            branch=r["branch"],
            run=r["run"],
            kind=r["kind"],
            request_raw=_unpacked(bytes(r["request_raw"])) if "request_raw" in keys else b"",
            response=bytes(r["response"]) if "response" in keys else b"",
            protocol=r["protocol"],
            delivered=bytes(r["delivered"]) if "delivered" in keys else b"",
            delivered_run=r["delivered_run"],
            delivered_at=r["delivered_at"],
            token_ids=json.loads(r["token_ids"]),
            logprobs=json.loads(r["logprobs"]),
            prompt_token_ids=tail,
            policy_version=r["policy_version"],
            abandoned=bool(r["abandoned"]),
            replays=r["replays"],
            created_at=r["created_at"],
            after_len=r["after_len"],
            mode=r["mode"],
            lineage=Lineage(
                r["parent_id"],
                None if r["prefix_exact"] is None else bool(r["prefix_exact"]),
                r["common_prefix"],
                r["break_reason"],
            ),
            finish_reason=r["finish_reason"],
            sampling=Sampling(**json.loads(r["sampling"])),
            logprobs_mode=r["logprobs_mode"],
            tools_key=r["tools_key"],
            upstream_ms=r["upstream_ms"],
            sending_run=r["sending_run"],
            sending_at=r["sending_at"],
            edge=r["edge"],
            edge_parent=r["edge_parent"],
        )

    def cursor(self, episode_id: str) -> dict[str, int]:
        """The ledger position a snapshot records: every turn up to `turn` happened before it."""
        with self._read() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(id), 0) AS turn, COUNT(*) AS turns FROM turns WHERE episode_id = ?",
                (episode_id,),
            ).fetchone()
        return {"turn": int(row["turn"]), "turns": int(row["turns"])}

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
            return self._turn(db, row) if row is not None else None

    def _sequence(self, db: Connection, turn_id: int) -> list[int]:
        """A turn's prompt ids plus its sampled ids: from the cache, or rebuilt from its row and
        those of the ancestors it takes its prompt from."""
        chain: list[Any] = []
        seq = self._sequences.get(turn_id)
        at = turn_id
        while seq is None:
            row = db.execute(
                "SELECT id, parent_id, prompt_base, prompt_token_ids, token_ids FROM turns WHERE id = ?",
                (at,),
            ).fetchone()
            chain.append(row)
            if not row["prompt_base"]:
                seq = []
            else:
                at = row["parent_id"]
                seq = self._sequences.get(at)
        for row in reversed(chain):
            tail, sampled = json.loads(row["prompt_token_ids"]), json.loads(row["token_ids"])
            seq = seq[: row["prompt_base"]] + tail + sampled
            self._sequences.put(row["id"], seq)
        return seq

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

    def replay(self, episode_id: str, run: int, request: CanonicalRequest) -> Turn | None:
        """The turn a request of `run` is answered with from the ledger (`find`), its replay
        noted as delivered."""
        with self._tx():
            turn = self.find(episode_id, request, run)
            if turn is not None:
                self.replayed(turn.id, run)
            return turn

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

    def parent(self, episode_id: str, request: CanonicalRequest) -> Turn | None:
        """The recorded turn this request continues: the one whose conversation (its request plus
        its answer) is the longest proper prefix of the request's (a read, no commit). Its bodies
        (request, response, delivery) are not read: they are megabytes in a long conversation."""
        with self._read() as db:
            return self._parent(db, episode_id, request)

    def _parent(self, db: Connection, episode_id: str, request: CanonicalRequest) -> Turn | None:
        lengths: list[int] = []
        if request.kind == "completion":
            lengths = [r["after_len"] for r in db.execute(
                "SELECT DISTINCT after_len FROM turns WHERE episode_id = ? AND kind = ?", (episode_id, request.kind)
            )]  # fmt: skip
        hashes = request.prefix_hashes(lengths)
        if not hashes:
            return None
        row = db.execute(
            f"SELECT {_BUT_BODIES} FROM turns WHERE episode_id = ? AND after_hash IN ({','.join('?' * len(hashes))})"
            " ORDER BY after_len DESC, abandoned, id DESC LIMIT 1",
            (episode_id, *hashes),
        ).fetchone()
        return self._turn(db, row) if row is not None else None

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
        sampling: Sampling = Sampling(),
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
        with self._tx() as db:
            current = run
            if live_run is not None:
                current, ended = live_run(db)
                if ended:
                    raise Conflict(ended)
            if lineage is None:
                lineage = extension(self._parent(db, episode_id, request), prompt_token_ids)
            parent_id = lineage.parent_id
            parent = (
                db.execute("SELECT branch FROM turns WHERE id = ?", (parent_id,)).fetchone()
                if parent_id is not None
                else None
            )
            where = "episode_id = ? AND parent_id IS NOT DISTINCT FROM ? AND abandoned = 0"  # NULL-safe =
            # In index order, stated so that every database numbers the abandoned branches alike.
            earlier = db.execute(
                f"SELECT id, branch, delivered_at, sending_at FROM turns WHERE {where} AND delivered_run < ?"
                " AND sending_run < ? ORDER BY delivered_run, id",
                (episode_id, parent_id, run, run),
            ).fetchall()
            stale = [
                s
                for s in earlier
                if all(s[at] is None or s[at] > resumed_at for at in ("delivered_at", "sending_at"))
            ]
            overtaken = current > run and (
                db.execute(
                    f"SELECT 1 FROM turns WHERE {where} AND (delivered_run > ? OR sending_run > ?) LIMIT 1",
                    (episode_id, parent_id, run, run),
                ).fetchone()
                is not None
            )
            next_branch = self._next_branch(db, episode_id)
            base = parent["branch"] if parent is not None else 0
            for s in stale:
                # The diverged continuation keeps its turns under a new branch number; the new turn
                # takes over the branch it was on.
                moved = s["branch"] == base
                self._abandon(
                    db, s["id"], old_branch=s["branch"], new_branch=next_branch if moved else s["branch"]
                )
                next_branch += int(moved)
            edge, edge_parent, branch = self._place(
                db,
                episode_id,
                edges.shape(request),
                request.fingerprint,
                parent_id,
                base,
                bool(stale),
                next_branch,
            )
            if overtaken:  # a branch of its own, past any `_place` just took
                branch = self._next_branch(db, episode_id)
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
                    episode_id, parent_id, branch, run, request.kind, request.fingerprint, after_hash, after_len,
                    json.dumps({"params": request.params, "size": request.size}), _packed(request_raw),
                    json.dumps(answer), response, protocol, delivered, run, json.dumps(token_ids), json.dumps(logprobs),
                    json.dumps(prompt_token_ids[base:]), policy_version, upstream_ms, now, mode, exact,
                    lineage.common_prefix, lineage.break_reason, finish_reason, json.dumps(dataclasses.asdict(sampling)),
                    logprobs_mode, tools_key, base, int(overtaken), run if sending else 0, now if sending else None,
                    edge.value, edge_parent, json.dumps(list(spawns)),
                ),
            ).fetchone()  # fmt: skip
            self._sequences.put(inserted["id"], prompt_token_ids + token_ids)
            return Turn(
                id=inserted["id"], episode_id=episode_id, parent_id=parent_id, branch=branch, run=run,
                kind=request.kind, request_raw=request_raw, response=response, protocol=protocol,
                delivered=delivered, delivered_run=run, delivered_at=None, token_ids=token_ids, logprobs=logprobs,
                prompt_token_ids=prompt_token_ids, policy_version=policy_version, abandoned=overtaken, replays=0,
                created_at=now, after_len=after_len, mode=mode, lineage=lineage, finish_reason=finish_reason,
                sampling=sampling, logprobs_mode=logprobs_mode, tools_key=tools_key, upstream_ms=upstream_ms,
                sending_run=run if sending else 0, sending_at=now if sending else None, edge=edge.value,
                edge_parent=edge_parent,
            )  # fmt: skip

    def _place(
        self,
        db: Connection,
        episode_id: str,
        shape: edges.Shape,
        fingerprint: str,
        parent_id: int | None,
        base: int,
        diverged: bool,
        next_branch: int,
    ) -> tuple[edges.Edge, int | None, int]:
        """The new turn's edge, the turn it hangs from and its branch (see `edges`)."""
        if parent_id is not None:
            if shape.asks_for_summary:
                return edges.Edge.COMPACTION, parent_id, next_branch
            if self._held(db, episode_id, parent_id, base):
                return edges.Edge.PARALLEL, parent_id, next_branch
            return (edges.Edge.DIVERGENCE if diverged else edges.Edge.CONTINUATION), parent_id, base
        live = "episode_id = ? AND abandoned = 0"
        compactions = db.execute(
            f"SELECT id, branch, answer, edge_parent FROM turns WHERE {live} AND edge = ? ORDER BY id DESC",
            (episode_id, edges.Edge.COMPACTION.value),
        ).fetchall()
        summaries = {c["id"]: edges.answer_text(json.loads(c["answer"])) for c in compactions}
        if shape.continues_summary(summaries.values()):
            if not compactions:  # summarised elsewhere: main carries on, from no recorded turn
                return edges.Edge.CONTINUATION, None, 0
            of = next((c for c in compactions if summaries[c["id"]] and summaries[c["id"]] in shape.first_user),
                      compactions[0])  # fmt: skip
            continued = db.execute("SELECT branch FROM turns WHERE id = ?", (of["edge_parent"],)).fetchone()
            return edges.Edge.CONTINUATION, of["id"], continued["branch"] if continued is not None else 0
        if shape.first_user:
            for row in db.execute(
                f"SELECT id, spawns FROM turns WHERE {live} AND spawns <> '[]' ORDER BY id DESC",
                (episode_id,),
            ):
                if any(p in shape.first_user for p in json.loads(row["spawns"])):
                    return edges.Edge.SUBAGENT, row["id"], next_branch
        primary = db.execute(
            f"SELECT id, tools_key, fingerprint FROM turns WHERE {live} AND parent_id IS NULL AND branch = 0"
            " ORDER BY id LIMIT 1",
            (episode_id,),
        ).fetchone()
        if primary is None:
            return edges.Edge.ROOT, None, 0
        if primary["fingerprint"] == fingerprint:  # asked again and sampled afresh
            return edges.Edge.PARALLEL, None, next_branch
        if not shape.tools and primary["tools_key"]:
            return edges.Edge.SIDE_CALL, None, next_branch
        if shape.tools and not primary["tools_key"] and not self._has_children(db, primary["id"]):
            # What began the episode listing no tools, alone, was a side call (a title, a topic
            # check) made before the primary conversation's first request was recorded.
            db.execute(
                "UPDATE turns SET edge = ?, branch = ? WHERE id = ?",
                (edges.Edge.SIDE_CALL.value, next_branch, primary["id"]),
            )
            return edges.Edge.ROOT, None, 0
        return edges.Edge.SUBAGENT, None, next_branch

    @staticmethod
    def _held(db: Connection, episode_id: str, parent_id: int, branch: int) -> bool:
        """A live child of the parent is on this branch."""
        return (
            db.execute(
                "SELECT 1 FROM turns WHERE episode_id = ? AND parent_id = ? AND abandoned = 0 AND branch = ? LIMIT 1",
                (episode_id, parent_id, branch),
            ).fetchone()
            is not None
        )

    @staticmethod
    def _next_branch(db: Connection, episode_id: str) -> int:
        return int(
            db.execute(
                "SELECT COALESCE(MAX(branch), -1) + 1 AS branch FROM turns WHERE episode_id = ?",
                (episode_id,),
            ).fetchone()["branch"]
        )

    @staticmethod
    def _has_children(db: Connection, turn_id: int) -> bool:
        return (
            db.execute("SELECT 1 FROM turns WHERE parent_id = ? LIMIT 1", (turn_id,)).fetchone() is not None
        )

    def _abandon(self, db: Connection, turn_id: int, old_branch: int, new_branch: int) -> None:
        todo = [turn_id]
        while todo:
            current = todo.pop()
            db.execute(
                "UPDATE turns SET abandoned = 1, branch = CASE WHEN branch = ? THEN ? ELSE branch END WHERE id = ?",
                (old_branch, new_branch, current),
            )
            todo += [r["id"] for r in db.execute("SELECT id FROM turns WHERE parent_id = ?", (current,))]

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
        with self._tx() as db:
            live = db.execute(
                "SELECT COUNT(*) AS n FROM turns WHERE episode_id = ? AND abandoned = 0", (episode_id,)
            ).fetchone()
            db.execute(
                "UPDATE turns SET abandoned = 1, branch = branch + ? WHERE episode_id = ? AND abandoned = 0",
                (self._next_branch(db, episode_id), episode_id),
            )
            return int(live["n"])

    def turns(self, episode_id: str) -> list[Turn]:
        with self._read() as db:
            rows = db.execute(
                "SELECT * FROM turns WHERE episode_id = ? ORDER BY id", (episode_id,)
            ).fetchall()
            out: list[Turn] = []
            sequences: dict[int, list[int]] = {}
            for r in rows:  # a parent's id is below its children's
                turn = self._turn(db, r, sequences)
                sequences[turn.id] = turn.prompt_token_ids + turn.token_ids
                out.append(turn)
        return out

    def branches(self, episode_id: str) -> list[Branch]:
        """Every branch with its turns; branch 0 is the main one."""
        by_branch: dict[int, list[Turn]] = {}
        for t in self.turns(episode_id):
            by_branch.setdefault(t.branch, []).append(t)
        return [Branch(b, turns, all(t.abandoned for t in turns)) for b, turns in sorted(by_branch.items())]

    # -- rewards ----------------------------------------------------------------------------

    def record_verification(self, episode_id: str, v: Verification) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO verifications (episode_id, reward, exit_code, timed_out, log, duration_ms, at)"
                " VALUES (?,?,?,?,?,?,?) ON CONFLICT (episode_id) DO UPDATE SET reward = excluded.reward,"
                " exit_code = excluded.exit_code, timed_out = excluded.timed_out, log = excluded.log,"
                " duration_ms = excluded.duration_ms, at = excluded.at",
                (episode_id, v.reward, v.exit_code, int(v.timed_out), v.log, v.duration_ms, time.time()),
            )

    def verification(self, episode_id: str) -> Verification | None:
        with self._read() as db:
            r = db.execute("SELECT * FROM verifications WHERE episode_id = ?", (episode_id,)).fetchone()
        if r is None:
            return None
        return Verification(
            r["reward"], r["exit_code"], bool(r["timed_out"]), bytes(r["log"]), r["duration_ms"]
        )


PACK_OVER = 16 << 10
"""Request bodies longer than this are stored zstd-compressed: a long conversation's body is
mostly the same text turn after turn, and stored whole it would be most of what each commit
writes."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _packed(body: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(body) if len(body) > PACK_OVER else body


def _unpacked(stored: bytes) -> bytes:
    """A stored body as it arrived: a zstd frame (its magic tells; no harness body, JSON, begins
    with it) is decompressed."""
    return zstandard.ZstdDecompressor().decompress(stored) if stored.startswith(_ZSTD_MAGIC) else stored


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items two sequences share (slices compare in C; a binary search over
    them keeps a long history's check cheap)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def extension(parent: Turn | None, prompt_ids: Sequence[int], reason: str = "") -> Lineage:
    """How a prompt stands to the tokens of the turn it continues: whether it begins with the
    parent's prompt plus its sampled ids, and if not, where it leaves them."""
    if parent is None:
        return ROOT
    before = [*parent.prompt_token_ids, *parent.token_ids]
    if not prompt_ids or not parent.prompt_token_ids:
        return Lineage(parent.id, None, 0, "the model server returned no prompt token ids to check")
    common = common_prefix(before, prompt_ids)
    if common == len(before):
        return Lineage(parent.id, True, common)
    why = reason or "the model server rendered the conversation anew as text"
    return Lineage(
        parent.id,
        False,
        common,
        f"{why}: the prompt leaves the tokens sampled so far at {common} of {len(before)}",
    )
