"""The trajectory ledger on its own, in SQLite and in PostgreSQL (`ledgers.py`), held to the same
tests: turns round-trip exactly, the tree branches and abandons as the matching rule says, a
batch undoes only the call that failed, and ledgers on one database (two orchestrators, or one
restarted) see every turn the others recorded."""

from __future__ import annotations

import ipaddress
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain import Conflict, EpisodeSpec, EpisodeState, FailedPrecondition, StandingBy
from orchestrator.gateway.generation import Generation, ToolCall
from orchestrator.gateway.protocols import anthropic
from orchestrator.state import PostgresStateStore, SqliteStateStore, StateStore, live_run
from orchestrator.trajectory import CanonicalRequest, Ledger, Sampling, Turn, Verification
from orchestrator.trajectory.canonical import canonical_message
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener
from tests.postgres import PostgresServer

BYTES = bytes(range(256)) * 2
"""Every byte value, NUL included: raw bodies and deliveries are stored as they are."""


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    with opener(request, tmp_path / "state.db") as open_:
        yield open_


@pytest.fixture
def ledger(open_ledger: OpenLedger) -> Ledger:
    return open_ledger()


def _chat(*texts: str) -> CanonicalRequest:
    """A chat request whose messages are these texts, the user's and the model's in turn."""
    roles = ("user", "assistant")
    return CanonicalRequest.parse(
        "chat",
        {"model": "m", "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]},
    )


def _record(
    ledger: Ledger,
    request: CanonicalRequest,
    answer: str,
    run: int = 1,
    resumed_at: float = 0.0,
    episode_id: str = "ep-1",
    **fields: Any,
) -> Turn:
    """Record a turn whose answer is the model message `answer`, as the gateway would."""
    recorded: dict[str, Any] = {
        "request_raw": b"raw:" + BYTES, "response": b"response:" + BYTES, "protocol": "chat",
        "delivered": b"delivered:" + BYTES, "token_ids": [5, 6, 7], "logprobs": [-0.1, -2.5e-7, -13.25],
        "prompt_token_ids": [1, 2], "policy_version": "policy-v1", "upstream_ms": 12.5,
    }  # fmt: skip
    recorded.update(fields)
    message = canonical_message({"role": "assistant", "content": answer})
    return ledger.record(episode_id, run, resumed_at, request, answer=message, **recorded)


@pytest.mark.timeout(30)
def test_a_turn_its_deliveries_and_a_reward_round_trip_exactly(ledger: Ledger) -> None:
    turn = _record(ledger, _chat("hi"), "hello")
    assert ledger.turns("ep-1") == [turn] and ledger.turns("ep-2") == []
    assert turn.delivered == b"delivered:" + BYTES and turn.logprobs == [-0.1, -2.5e-7, -13.25]
    assert ledger.cursor("ep-1") == {"turn": turn.id, "turns": 1} and ledger.cursor("ep-2") == {
        "turn": 0,
        "turns": 0,
    }
    assert ledger.find("ep-1", _chat("hi")) == turn and ledger.find("ep-1", _chat("hi!")) is None

    ledger.delivered(turn.id, 1234.5678)
    replayed = ledger.replay("ep-1", 3, _chat("hi"))
    assert replayed is not None and replayed.delivered_at == 1234.5678
    ledger.replayed(turn.id, 2, at=1300.5)  # an older run does not take the delivery back
    (again,) = ledger.turns("ep-1")
    assert (again.replays, again.delivered_run, again.delivered_at) == (2, 3, 1300.5)

    assert ledger.verifications.get("ep-1") is None
    ledger.verifications.record("ep-1", Verification(None, None, True, b"", 1.0))
    ledger.verifications.record(
        "ep-1", Verification(0.75, 3, False, BYTES, 812.25, {"tests": 0.5, "lint": -1e-3})
    )
    assert ledger.verifications.get("ep-1") == Verification(
        0.75, 3, False, BYTES, 812.25, {"tests": 0.5, "lint": -1e-3}
    ), "the last one stands"


@pytest.mark.timeout(30)
def test_a_restored_harness_that_diverges_abandons_what_it_never_had(ledger: Ledger) -> None:
    a = _record(ledger, _chat("hi"), "a")
    b = _record(ledger, _chat("hi", "a", "more"), "b")
    parallel = _record(ledger, _chat("hi", "a", "other"), "p")
    assert (b.parent_id, b.branch, parallel.parent_id, parallel.branch) == (a.id, 0, a.id, 1)
    ledger.delivered(a.id, 10.0)  # b and the parallel call never finished reaching the harness

    # Run 2 was restored from a snapshot taken at 20: the harness had a, replays it, then diverges.
    assert ledger.replay("ep-1", 2, _chat("hi")) is not None
    c = _record(ledger, _chat("hi", "a", "different"), "c", run=2, resumed_at=20.0)
    abandoned = {t.id: (t.abandoned, t.branch) for t in ledger.turns("ep-1")}
    assert abandoned == {a.id: (False, 0), b.id: (True, 2), parallel.id: (True, 1), c.id: (False, 0)}

    # Run 3 was restored from a snapshot taken at 5, before a was delivered: a new first request
    # abandons every root the harness never had (the NULL parent matches NULL), and their trees.
    d = _record(ledger, _chat("a fresh start"), "d", run=3, resumed_at=5.0)
    assert (d.parent_id, d.branch) == (None, 0)
    assert [t.id for t in ledger.turns("ep-1") if not t.abandoned] == [d.id]
    assert [b.id for b in ledger.branches("ep-1")] == [0, 1, 2, 3] and not ledger.branches("ep-1")[
        0
    ].abandoned


@pytest.mark.timeout(30)
def test_a_delivery_under_way_when_the_orchestrator_stopped_counts_as_had(open_ledger: OpenLedger) -> None:
    """A turn whose delivery was noted as under way, and never seen to end, may be the harness's:
    a restore from a snapshot that froze the sandbox after that began keeps it, as one from before
    does not. A delivery seen to fail is taken back."""
    ledger = open_ledger()
    a = _record(ledger, _chat("hi"), "a")
    ledger.delivered(a.id, 10.0, 1)
    maybe = _record(ledger, _chat("hi", "a", "p1"), "p1", sending=True)
    assert maybe.delivery_uncertain and maybe.sending_run == 1 and maybe.delivered_at is None
    failed = _record(ledger, _chat("hi", "a", "p2"), "p2", sending=True)
    ledger.unsent(failed.id)
    restarted = open_ledger()  # the orchestrator stopped; another takes over the database
    assert maybe.sending_at is not None
    _record(restarted, _chat("hi", "a", "p3"), "p3", run=2, resumed_at=maybe.sending_at + 1)
    assert [t.abandoned for t in restarted.turns("ep-1")] == [False, False, True, False]
    # The same delivery under way in run 2, after a snapshot that froze before it began: stale.
    restarted.sending(maybe.id, 2, maybe.sending_at + 2)
    _record(restarted, _chat("hi", "a", "p4"), "p4", run=3, resumed_at=maybe.sending_at + 1.5)
    assert [t.abandoned for t in restarted.turns("ep-1")] == [False, True, True, True, False]


def _shape(ledger: Ledger) -> dict[str, tuple[bool, int]]:
    """Each turn by what it delivered: whether it is abandoned, and whether it is on the main branch."""
    return {t.delivered.decode(): (t.abandoned, t.branch == 0) for t in ledger.turns("ep-1")}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("late_commits", ["first", "last"])
def test_a_turn_that_outlives_its_run_is_placed_alike_whichever_commits_first(
    ledger: Ledger, late_commits: str
) -> None:
    """Run 1's node is lost while its turn generates; run 2, restored from a snapshot taken
    before it, asks something else of the same parent. Whichever of the two turns commits first,
    run 2's is live on the main branch and run 1's late one abandoned."""
    a = _record(ledger, _chat("hi"), "a", delivered=b"a")
    ledger.delivered(a.id, 10.0)

    def late() -> Turn:
        return _record(ledger, _chat("hi", "a", "more"), "b", delivered=b"late", live_run=lambda db: (2, ""))

    def diverged() -> Turn:
        return _record(ledger, _chat("hi", "a", "different"), "c", run=2, resumed_at=20.0, delivered=b"new")

    turns = [late(), diverged()] if late_commits == "first" else [diverged(), late()]
    assert all(t.parent_id == a.id for t in turns)
    assert _shape(ledger) == {"a": (False, True), "late": (True, False), "new": (False, True)}


@pytest.mark.timeout(30)
def test_a_turn_that_outlives_its_episode_is_refused(ledger: Ledger) -> None:
    _record(ledger, _chat("hi"), "a")
    with pytest.raises(Conflict, match="has ended"):
        _record(
            ledger,
            _chat("hi", "a", "more"),
            "b",
            live_run=lambda db: (1, "episode ep-1 has ended (CANCELLED)"),
        )
    assert [t.delivered for t in ledger.turns("ep-1")] == [b"delivered:" + BYTES], "nothing was recorded"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("database", DATABASES)
def test_the_record_reads_the_episode_in_its_own_transaction(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """As the orchestrator runs them, the ledger beside the state store on one database: the
    transaction that records a turn reads the episode's run and state from the store's table."""
    if database == "postgres":
        store: StateStore = PostgresStateStore(request.getfixturevalue("postgres").database())
        ledger = Ledger.postgres(store.database)
    else:
        store, ledger = SqliteStateStore(tmp_path / "state.db"), Ledger.sqlite(tmp_path / "state.db")
    try:
        e = store.episodes.submit(
            EpisodeSpec(image="base", command=("true",)), "", ipaddress.ip_network("10.200.0.0/16")
        )
        store.episodes.update(e.id, runs=1)
        live = {"episode_id": e.id, "live_run": lambda db: live_run(db, e.id)}
        a = _record(ledger, _chat("hi"), "a", **live)
        store.episodes.update(e.id, runs=2)  # a new run begins while run 1's next turn generates
        new = _record(ledger, _chat("hi", "a", "different"), "c", run=2, resumed_at=20.0, **live)
        late = _record(ledger, _chat("hi", "a", "more"), "b", **live)
        assert (a.abandoned, new.abandoned, late.abandoned) == (False, False, True)
        store.episodes.transition(e.id, EpisodeState.CANCELLED, "cancelled")
        with pytest.raises(Conflict, match=rf"episode {e.id} has ended \(CANCELLED\)"):
            _record(ledger, _chat("hi", "a", "different", "c", "next"), "d", run=2, **live)
        assert len(ledger.turns(e.id)) == 3
    finally:
        ledger.close()
        store.close()


@pytest.mark.timeout(30)
def test_a_batch_undoes_only_the_call_that_failed(ledger: Ledger) -> None:
    a = _record(ledger, _chat("hi"), "a")
    b = _record(ledger, _chat("hi", "a", "more"), "b")
    ledger.delivered(a.id, 10.0)

    def diverge_then_fail() -> Turn:
        # It abandons b, the stale sibling, then its insert fails in the database (NOT NULL).
        return _record(ledger, _chat("hi", "a", "diverged"), "x", run=2, resumed_at=20.0, upstream_ms=None)

    results = ledger.batch([
        lambda: ledger.replay("ep-1", 2, _chat("hi")),
        diverge_then_fail,
        lambda: _record(ledger, _chat("elsewhere"), "e", episode_id="ep-2"),
        lambda: ledger.replay("ep-2", 1, _chat("elsewhere")),  # sees the turn recorded just before
        lambda: ledger.delivered(a.id, 30.0),
    ])  # fmt: skip
    assert [ok for ok, _ in results] == [True, False, True, True, True]
    assert "upstream_ms" in str(results[1][1])
    e = results[2][1]
    replayed = results[3][1]
    assert isinstance(e, Turn) and isinstance(replayed, Turn) and replayed.id == e.id
    (a_after, b_after) = ledger.turns("ep-1")
    assert b_after.id == b.id and (a_after.replays, a_after.delivered_run, a_after.delivered_at) == (
        1,
        2,
        30.0,
    )
    assert (b_after.abandoned, b_after.branch) == (False, 0), "the failed call's abandonment is undone"
    assert [(t.id, t.replays) for t in ledger.turns("ep-2")] == [(e.id, 1)]


@pytest.mark.timeout(60)
def test_ledgers_on_one_database_see_each_others_turns(open_ledger: OpenLedger) -> None:
    """Two orchestrators on one database (replicas, or a leader and its successor): each places
    its turns in the tree the other recorded, and concurrent writers take turns."""
    first, second = open_ledger(), open_ledger()
    a = _record(first, _chat("hi"), "a")
    assert second.find("ep-1", _chat("hi")) == a
    b = _record(second, _chat("hi", "a", "more"), "b")
    assert (b.parent_id, b.branch) == (a.id, 0)
    assert first.turns("ep-1") == second.turns("ep-1") == [a, b]

    # Parallel calls from one point, recorded at once by four threads over both ledgers: each
    # gets a branch of its own, which only writers that see each other's commits can give.
    errors: list[BaseException] = []

    def sibling(ledger: Ledger, i: int) -> None:
        try:
            for j in range(5):
                _record(ledger, _chat("hi", "a", f"parallel {i}.{j}"), "p")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sibling, args=((first, second)[i % 2], i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    children = [t for t in first.turns("ep-1") if t.parent_id == a.id]
    assert sorted(t.branch for t in children) == list(range(21))
    assert first.cursor("ep-1") == second.cursor("ep-1") == {"turn": max(t.id for t in children), "turns": 22}


@pytest.mark.timeout(30)
def test_a_ledger_opened_again_finds_every_turn(open_ledger: OpenLedger) -> None:
    """What a new leader, or the same orchestrator restarted, finds: every turn as it was."""
    first = open_ledger()
    a = _record(first, _chat("hi"), "a")
    b = _record(first, _chat("hi", "a", "more"), "b")
    first.delivered(a.id, 10.0)
    first.verifications.record("ep-1", Verification(1.0, 0, False, b"ok", 5.0))
    recorded, cursor = first.turns("ep-1"), first.cursor("ep-1")
    first.close()

    again = open_ledger()
    assert again.turns("ep-1") == recorded and again.cursor("ep-1") == cursor
    assert again.verifications.get("ep-1") == Verification(1.0, 0, False, b"ok", 5.0)
    replayed = again.replay("ep-1", 2, _chat("hi", "a", "more"))
    assert replayed is not None and replayed.id == b.id and replayed.delivered == b.delivered
    c = _record(again, _chat("hi", "a", "more", "b", "go on"), "c")
    assert (c.parent_id, c.branch, c.id > b.id) == (b.id, 0, True)


@pytest.mark.timeout(30)
def test_a_standby_opens_the_ledger_and_reads_it_but_records_nothing(postgres: PostgresServer) -> None:
    """On a shared PostgreSQL database the ledger's writes are fenced like the store's: an
    orchestrator that does not hold the lease changes nothing, yet it opens the ledger."""
    url = postgres.database()
    leader, standby = PostgresStateStore(url), PostgresStateStore(url)
    try:
        lease = leader.lease("leader")
        assert lease.try_acquire()
        recorded = _record(Ledger.postgres(leader.database), _chat("hi"), "a")
        standby.lease("standby")
        ledger = Ledger.postgres(standby.database)
        assert ledger.turns("ep-1") == [recorded]
        with pytest.raises(StandingBy):
            _record(ledger, _chat("hi", "a", "more"), "b")
        with pytest.raises(StandingBy):
            ledger.batch([lambda: ledger.delivered(recorded.id, 1.0)])
        lease.release()
    finally:
        leader.close()
        standby.close()
        postgres.drop(url)


OLDER_TURNS = """
CREATE TABLE turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT, episode_id TEXT NOT NULL, parent_id INTEGER, branch INTEGER NOT NULL,
    run INTEGER NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL, after_hash TEXT NOT NULL,
    after_len INTEGER NOT NULL, request TEXT NOT NULL, request_raw BLOB NOT NULL, answer TEXT NOT NULL,
    response BLOB NOT NULL, token_ids TEXT NOT NULL, logprobs TEXT NOT NULL, prompt_token_ids TEXT NOT NULL,
    policy_version TEXT NOT NULL, abandoned INTEGER NOT NULL DEFAULT 0, replays INTEGER NOT NULL DEFAULT 0,
    upstream_ms REAL NOT NULL, created_at REAL NOT NULL
);
"""
"""The turns table as Stasis kept it before deliveries were recorded."""


def test_a_sqlite_ledger_from_an_older_stasis_is_refused(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.executescript(OLDER_TURNS)
    with pytest.raises(FailedPrecondition, match="from an older Stasis; start with a new state dir"):
        Ledger.sqlite(tmp_path / "state.db")


LAST_RELEASE_TURNS = """
CREATE TABLE turns (
    id {id}, episode_id TEXT NOT NULL, parent_id {int}, branch {int} NOT NULL, run {int} NOT NULL,
    kind TEXT NOT NULL, fingerprint TEXT NOT NULL, after_hash TEXT NOT NULL, after_len {int} NOT NULL,
    request TEXT NOT NULL, request_raw {bytes} NOT NULL, answer TEXT NOT NULL, response {bytes} NOT NULL,
    protocol TEXT NOT NULL, delivered {bytes} NOT NULL, delivered_run {int} NOT NULL, delivered_at {real},
    token_ids TEXT NOT NULL, logprobs TEXT NOT NULL, prompt_token_ids TEXT NOT NULL, policy_version TEXT NOT NULL,
    abandoned {int} NOT NULL DEFAULT 0, replays {int} NOT NULL DEFAULT 0, upstream_ms {real} NOT NULL,
    created_at {real} NOT NULL
);
INSERT INTO turns (episode_id, parent_id, branch, run, kind, fingerprint, after_hash, after_len, request,
    request_raw, answer, response, protocol, delivered, delivered_run, token_ids, logprobs, prompt_token_ids,
    policy_version, upstream_ms, created_at)
VALUES ('ep-old', NULL, 0, 1, 'chat', 'f', 'h', 2, '{{}}', {blob}, '{{}}', {blob}, 'chat', {blob}, 1, '[7]', '[-0.5]',
    '[1, 2]', 'v1', 1.0, 1.0);
CREATE TABLE verifications (
    episode_id TEXT PRIMARY KEY, reward {real}, exit_code {int}, timed_out {int} NOT NULL, log {bytes} NOT NULL,
    duration_ms {real} NOT NULL, at {real} NOT NULL
);
INSERT INTO verifications VALUES ('ep-old', 0.5, 0, 0, {blob}, 3.0, 1.0);
"""
"""The turns table as the last release kept it (before prompts were checked), with one turn, and
the verifications table from before metrics, with one reward."""


@pytest.mark.parametrize("kind", DATABASES)
def test_a_ledger_from_the_last_release_gains_its_new_columns(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Its turns read as text-mode turns whose prompts were not checked, and new turns record
    everything."""
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "state.db") as db:
            db.executescript(LAST_RELEASE_TURNS.format(id="INTEGER PRIMARY KEY AUTOINCREMENT", int="INTEGER", bytes="BLOB", real="REAL", blob="x''"))  # fmt: skip
        ledgers = [Ledger.sqlite(tmp_path / "state.db"), Ledger.sqlite(tmp_path / "state.db")]
        stores: list[PostgresStateStore] = []
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        url = server.database()
        stores = [PostgresStateStore(url), PostgresStateStore(url)]
        stores[0].database.create(LAST_RELEASE_TURNS.format(id="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", int="BIGINT", bytes="BYTEA", real="DOUBLE PRECISION", blob="''::bytea"))  # fmt: skip
        ledgers = [Ledger.postgres(s.database) for s in stores]
    try:
        (old,) = ledgers[1].turns("ep-old")
        assert old.mode == "text" and old.prefix_exact is None and old.sampling == Sampling()
        assert old.token_ids == [7] and old.finish_reason == "" and old.logprobs_mode == ""
        assert (old.edge, old.edge_parent, old.sending_run, old.sending_at) == ("", None, 0, None)
        new = _record(ledgers[1], _chat("hi"), "hello", finish_reason="stop", mode="tokens")
        assert ledgers[0].turns("ep-1") == [new]
        assert ledgers[1].verifications.get("ep-old") == Verification(0.5, 0, False, b"", 3.0, {})
        ledgers[1].verifications.record("ep-1", Verification(1.0, 0, False, b"ok", 2.0, {"sorted": 1.0}))
        assert ledgers[0].verifications.get("ep-1") == Verification(
            1.0, 0, False, b"ok", 2.0, {"sorted": 1.0}
        )
    finally:
        for ledger in ledgers:
            ledger.close()
        for store in stores:
            store.close()


def test_a_completions_prefixes_hash_as_their_own_prompts_would() -> None:
    """Prefix hashes come from one pass over the prompt; each must be the hash a prompt of just
    that prefix has, whatever JSON escapes in it (quotes, controls, non-ASCII, astral planes)."""
    prompt = 'say "hi"\n\tthen \\ stop: é, 中文, 😀 and \x00 and \u2028.' * 3
    request = CanonicalRequest.parse("completion", {"prompt": prompt})
    lengths = [1, 5, 9, 10, 17, 30, 31, 32, 33, 60, len(prompt) - 1, len(prompt), 0, 5]
    hashes = request.prefix_hashes(lengths)
    wanted = sorted({n for n in lengths if 0 < n < len(prompt)}, reverse=True)
    assert hashes == [
        CanonicalRequest.parse("completion", {"prompt": prompt[:n]}).after("")[0] for n in wanted
    ]


@pytest.mark.parametrize("raw", ["", "  ", "[1,2]", "5", "not json", " padded ", '{"a": 1}', '{"a":1.0}'])
def test_a_tool_call_reads_back_as_itself_from_a_harness_given_it_as_an_object(raw: str) -> None:
    """An Anthropic harness gets a call's arguments as an object (`parsed_arguments`) and sends
    that back, not what the model wrote: its next request must find the turn as its parent."""
    call = ToolCall(id="c1", name="f", arguments=raw)
    answer = Generation("chat", tool_calls=[call]).answer()
    block = {"type": "tool_use", "id": "c1", "name": "f", "input": call.parsed_arguments()}
    (sent_back,) = anthropic.to_messages({"messages": [{"role": "assistant", "content": [block]}]})
    assert canonical_message(sent_back) == answer


@pytest.mark.timeout(30)
def test_a_prompt_that_extends_its_parent_is_stored_as_what_it_adds(open_ledger: OpenLedger) -> None:
    """Each prompt of a long conversation repeats the one before: a turn keeps only the tokens it
    adds, and any ledger on the database (its cache cold) rebuilds the whole prompt."""
    ledger = open_ledger()
    texts, prompt, recorded = ["u0"], list(range(1000)), []
    for n in range(4):
        turn = _record(ledger, _chat(*texts), f"a{n}", prompt_token_ids=prompt, token_ids=[7, 8, 9])
        assert turn.prefix_exact is True
        recorded.append(turn)
        prompt = [*prompt, 7, 8, 9, 100 + n]
        texts += [f"a{n}", f"u{n + 1}"]
    assert [len(t.prompt_token_ids) for t in recorded] == [1000, 1004, 1008, 1012]
    cold = open_ledger()
    assert cold.turns("ep-1") == recorded
    parent = cold.parent("ep-1", _chat(*texts))
    assert parent is not None and parent.id == recorded[-1].id
    assert parent.prompt_token_ids == recorded[-1].prompt_token_ids and parent.token_ids == [7, 8, 9]
    with cold._read() as db:  # what each row holds: the first its whole prompt, the others a token
        stored = [
            json.loads(r["prompt_token_ids"])
            for r in db.execute("SELECT prompt_token_ids FROM turns ORDER BY id")
        ]
    assert [len(s) for s in stored] == [1000, 1, 1, 1]
