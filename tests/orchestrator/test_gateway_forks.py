"""The gateway and ledger for fork children, against the real reference model: one gateway key
held by an episode and its fork children, each heard as itself by its sandbox's address; and a
child's trajectory, which begins with its parent's turns up to the fork's snapshot, shared."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.domain import Episode, EpisodeState
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener
from tests.orchestrator.test_gateway import USER, World, _chat, _count, _episode, _world

PARENT, FIRST, SECOND = "127.0.0.10", "127.0.0.11", "127.0.0.12"
"""The sandboxes' own addresses; node-1's agent is at 127.0.0.1."""


def _child(episode_id: str, address: str, index: int, snapshot: str = "snap-1") -> Episode:
    return replace(
        _episode(episode_id, f"own-{episode_id}"),
        address=address,
        forked_from=snapshot,
        fork_parent="ep-p",
        fork_index=index,
        key_of="ep-p",
    )


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    with opener(request, tmp_path / "ledger.db") as open_:
        yield open_


@pytest.fixture
def family(tmp_path: Path) -> Iterator[World]:
    """A parent and two fork children on node-1, all holding the parent's key (`tok-p`)."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    w = _world(tmp_path, model.url, model, family=True)
    w.episodes["ep-p"] = replace(_episode("ep-p", "tok-p"), address=PARENT)
    w.episodes["ep-c0"] = _child("ep-c0", FIRST, 0)
    w.episodes["ep-c1"] = _child("ep-c1", SECOND, 1)
    assert w.gateway.logprobs_mode("reference") == "processed"  # before the generations are counted
    _count(w)
    yield w
    w.gateway.stop()
    model.stop()


@pytest.mark.timeout(60)
def test_one_key_held_by_a_fork_family_is_heard_as_each_sandbox(family: World) -> None:
    for episode_id, address in (("ep-p", PARENT), ("ep-c0", FIRST), ("ep-c1", SECOND)):
        status, body = family.post(_chat(USER), token="tok-p", source=address)
        assert status == 200, body
        assert [t.delivered for t in family.ledger.turns(episode_id)] == [body], episode_id
    assert len(family.upstream_calls) == 3, "each holder's request was sampled for it"

    status, body = family.post(_chat(USER, seed=2), token="tok-p", source="127.0.0.13")
    assert status == 409 and b"not its live run" in body and b"conflict_error" in body, body

    # node-1's agent address speaks for every sandbox on node-1: which of them asks is unknown.
    status, body = family.post(_chat(USER, seed=2), token="tok-p", source="127.0.0.1")
    assert status == 409 and b"ep-p, ep-c0, ep-c1" in body and b"cannot be told" in body, body
    assert len(family.upstream_calls) == 3, "nothing refused went upstream"
    assert [len(family.ledger.turns(e)) for e in ("ep-p", "ep-c0", "ep-c1")] == [1, 1, 1]


@pytest.mark.timeout(60)
def test_an_ended_holder_of_a_fork_familys_key_is_refused(family: World) -> None:
    family.episodes["ep-c1"] = replace(family.episodes["ep-c1"], state=EpisodeState.SUCCEEDED)
    status, body = family.post(_chat(USER), token="tok-p", source=SECOND)
    assert status == 409 and b"not its live run" in body, "the ended child is no live holder"
    assert family.post(_chat(USER), token="tok-p", source=FIRST)[0] == 200, "its sibling goes on"

    family.episodes["ep-p"] = replace(family.episodes["ep-p"], state=EpisodeState.SUCCEEDED)
    status, body = family.post(_chat(USER), token="tok-p", source=PARENT)
    assert status == 403 and b"episode ep-p has ended" in body, body
    assert family.post(_chat(USER, seed=2), token="tok-p", source=FIRST)[0] == 200, (
        "a child outlives its parent"
    )
    assert family.ledger.turns("ep-c1") == [] and family.ledger.turns("ep-p") == []
    assert len(family.ledger.turns("ep-c0")) == 2
