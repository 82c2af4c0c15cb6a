"""The ledger's fork children, on SQLite and PostgreSQL: a child's trajectory shares its
ancestors' turns up to each fork's cursor, is never answered from them, keeps its origin after
the state store forgets it, and tells the edges of its own turns among the shared ones."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.domain import SnapshotRecord
from orchestrator.trajectory import ForkOrigin, atif, call_records
from orchestrator.trajectory.forks import origin_of
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener
from tests.orchestrator.test_ledger import _chat, _record
from tests.orchestrator.worlds import make_episode


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    with opener(request, tmp_path / "state.db") as open_:
        yield open_


@pytest.mark.timeout(30)
def test_a_grandchild_shares_each_ancestors_turns_up_to_its_fork(open_ledger: OpenLedger) -> None:
    origins: dict[str, ForkOrigin] = {}
    ledger = open_ledger(origins.get)
    a = _record(ledger, _chat("hi"), "a", episode_id="ep-p")
    origins["ep-c"] = ForkOrigin("ep-p", "snap-p", ledger.cursor("ep-p")["turn"])
    _record(ledger, _chat("hi", "a", "parent goes on"), "later", episode_id="ep-p")
    b = _record(ledger, _chat("hi", "a", "child"), "b", episode_id="ep-c")
    assert (b.parent_id, b.edge, b.branch) == (a.id, "fork", 0)
    origins["ep-g"] = ForkOrigin("ep-c", "snap-c", ledger.cursor("ep-c")["turn"])
    assert ledger.cursor("ep-c")["turn"] == b.id, "a child's cursor counts its own turns"
    _record(ledger, _chat("hi", "a", "child", "b", "child goes on"), "later", episode_id="ep-c")
    c = _record(ledger, _chat("hi", "a", "child", "b", "grandchild"), "c", episode_id="ep-g")
    assert (c.parent_id, c.edge, c.branch) == (b.id, "fork", 0)
    turns = ledger.turns("ep-g")
    assert [(t.id, t.episode_id, t.shared) for t in turns] == [
        (a.id, "ep-p", True), (b.id, "ep-c", True), (c.id, "ep-g", False),
    ]  # fmt: skip
    assert ledger.turns("ep-p")[0].shared is False and len(ledger.turns("ep-p")) == 2
    (document,) = atif("ep-g", turns)
    assert [s["extra"]["turn_id"] for s in document["steps"]] == [a.id, b.id, c.id]
    assert [r.turn_id for r in call_records(turns)] == [a.id, b.id, c.id]

    # Its origin outlives the store's record (the snapshot collected, the child's row gone).
    origins.clear()
    again = open_ledger()
    assert [t.id for t in again.turns("ep-g")] == [a.id, b.id, c.id]


@pytest.mark.timeout(30)
def test_a_child_is_never_answered_from_shared_turns_and_tells_its_own_edges(open_ledger: OpenLedger) -> None:
    origins: dict[str, ForkOrigin] = {}
    ledger = open_ledger(origins.get)
    a = _record(ledger, _chat("hi"), "a", episode_id="ep-p", tools_key="k")
    ledger.delivered(a.id, 1.0)
    origins["ep-c"] = ForkOrigin("ep-p", "snap-p", a.id)
    assert ledger.find("ep-c", _chat("hi")) is None and ledger.replay("ep-c", 1, _chat("hi")) is None
    assert ledger.parent("ep-c", _chat("hi", "a", "next")) == ledger.parent("ep-p", _chat("hi", "a", "next"))

    # The shared root asked again: a sample of the child's own, beside it.
    again = _record(ledger, _chat("hi"), "x", episode_id="ep-c")
    assert (again.parent_id, again.edge, again.branch) == (None, "parallel", 1)
    # A conversation with no recorded prefix and no tools while the shared primary lists them.
    side = _record(ledger, _chat("title?"), "t", episode_id="ep-c")
    assert (side.edge, side.branch) == ("side_call", 2)
    assert ledger.turns("ep-p")[0].edge == "root" and ledger.turns("ep-p")[0].branch == 0
    # Two requests from the same shared turn: a fork, then a parallel sibling.
    first = _record(ledger, _chat("hi", "a", "one"), "1", episode_id="ep-c")
    second = _record(ledger, _chat("hi", "a", "two"), "2", episode_id="ep-c")
    assert [(t.edge, t.branch) for t in (first, second)] == [("fork", 0), ("parallel", 3)]
    assert [b.id for b in ledger.branches("ep-c")] == [0, 1, 2, 3]
    assert [t.id for t in ledger.branches("ep-c")[0].turns] == [a.id, first.id]


@pytest.mark.timeout(30)
def test_an_origin_is_read_from_the_episode_and_its_source_snapshots_cursor() -> None:
    child = replace(make_episode("ep-c", "tok"), forked_from="snap-1", fork_parent="ep-p", key_of="ep-p")
    record = SnapshotRecord(
        "snap-1", "ep-p", 1, "", "node-1", "fork", 5.0, 0, 0, 0, {"turn": 7, "turns": 3}, {}
    )
    records = {"snap-1": record}
    assert origin_of(child, records.get) == ForkOrigin("ep-p", "snap-1", 7)
    assert origin_of(make_episode("ep-1", "tok"), records.get) is None, "forked from nothing"
    assert origin_of(None, records.get) is None
    assert origin_of(child, {}.get) is None, "its source's record is gone, and the cursor with it"
    odd = {"snap-1": replace(record, trajectory_cursor={"turn": "7"})}
    assert origin_of(child, odd.get) is None
