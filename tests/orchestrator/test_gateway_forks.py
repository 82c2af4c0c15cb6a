"""The gateway and ledger for fork children, against the real reference model: one gateway key
held by an episode and its fork children, each heard as itself by its sandbox's address; and a
child's trajectory, which begins with its parent's turns up to the fork's snapshot, shared."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain import Episode, EpisodeState
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from orchestrator.trajectory import ForkOrigin, fork_tree_samples, tree_samples
from orchestrator.trajectory.dataset import ForkMember, fork_group_rows
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener
from tests.orchestrator.onpolicy import assert_on_policy
from tests.orchestrator.test_tokens import TOKENS
from tests.orchestrator.worlds import (
    TOOLS,
    USER,
    World,
    chat_body,
    count_generations,
    make_episode,
    make_world,
)

PARENT, FIRST, SECOND = "127.0.0.10", "127.0.0.11", "127.0.0.12"
"""The sandboxes' own addresses; node-1's agent is at 127.0.0.1."""
CHILDREN = (FIRST, SECOND, "127.0.0.14")


def _child(episode_id: str, address: str, index: int, snapshot: str = "snap-1") -> Episode:
    return replace(
        make_episode(episode_id, f"own-{episode_id}"),
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
    w = make_world(tmp_path, model.url, model, family=True)
    w.episodes["ep-p"] = replace(make_episode("ep-p", "tok-p"), address=PARENT)
    w.episodes["ep-c0"] = _child("ep-c0", FIRST, 0)
    w.episodes["ep-c1"] = _child("ep-c1", SECOND, 1)
    assert w.gateway.logprobs_mode("reference") == "processed"  # before the generations are counted
    count_generations(w)
    yield w
    w.gateway.stop()
    model.stop()


@pytest.mark.timeout(60)
def test_one_key_held_by_a_fork_family_is_heard_as_each_sandbox(family: World) -> None:
    for episode_id, address in (("ep-p", PARENT), ("ep-c0", FIRST), ("ep-c1", SECOND)):
        status, body = family.post(chat_body(USER), token="tok-p", source=address)
        assert status == 200, body
        assert [t.delivered for t in family.ledger.turns(episode_id)] == [body], episode_id
    assert len(family.upstream_calls) == 3, "each holder's request was sampled for it"

    status, body = family.post(chat_body(USER, seed=2), token="tok-p", source="127.0.0.13")
    assert status == 409 and b"not its live run" in body and b"conflict_error" in body, body

    # node-1's agent address speaks for every sandbox on node-1: which of them asks is unknown.
    status, body = family.post(chat_body(USER, seed=2), token="tok-p", source="127.0.0.1")
    assert status == 409 and b"ep-p, ep-c0, ep-c1" in body and b"cannot be told" in body, body
    assert len(family.upstream_calls) == 3, "nothing refused went upstream"
    assert [len(family.ledger.turns(e)) for e in ("ep-p", "ep-c0", "ep-c1")] == [1, 1, 1]


@pytest.mark.timeout(60)
def test_an_ended_holder_of_a_fork_familys_key_is_refused(family: World) -> None:
    family.episodes["ep-c1"] = replace(family.episodes["ep-c1"], state=EpisodeState.SUCCEEDED)
    status, body = family.post(chat_body(USER), token="tok-p", source=SECOND)
    assert status == 409 and b"not its live run" in body, "the ended child is no live holder"
    assert family.post(chat_body(USER), token="tok-p", source=FIRST)[0] == 200, "its sibling goes on"

    family.episodes["ep-p"] = replace(family.episodes["ep-p"], state=EpisodeState.SUCCEEDED)
    status, body = family.post(chat_body(USER), token="tok-p", source=PARENT)
    assert status == 403 and b"episode ep-p has ended" in body, body
    assert family.post(chat_body(USER, seed=2), token="tok-p", source=FIRST)[0] == 200, (
        "a child outlives its parent"
    )
    assert family.ledger.turns("ep-c1") == [] and family.ledger.turns("ep-p") == []
    assert len(family.ledger.turns("ep-c0")) == 2


def _step(world: World, messages: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """One turn of a harness holding the parent's key: the model's answer, appended to
    `messages` with what the harness adds after it."""
    status, body = world.post(
        {"model": "reference", "messages": messages, "tools": TOOLS}, token="tok-p", source=source
    )
    assert status == 200, body
    message = json.loads(body)["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    messages.append(
        {"role": "assistant", "content": message.get("content"), **({"tool_calls": calls} if calls else {})}
    )
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "done"} for c in calls]
    if not calls:
        messages.append({"role": "user", "content": "go on"})
    return message


@pytest.fixture
def forked(tmp_path: Path, open_ledger: OpenLedger) -> Iterator[tuple[World, dict[str, ForkOrigin]]]:
    """A parent and three fork children in token mode; a child's origin is known once the test
    takes the parent's snapshot cursor (as the state store would give it)."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=7)).start()
    origins: dict[str, ForkOrigin] = {}
    ledger = open_ledger(origins.get)
    w = make_world(tmp_path, model.url, model, ledger, family=True, **TOKENS)
    w.episodes["ep-p"] = replace(make_episode("ep-p", "tok-p"), address=PARENT)
    for index, address in enumerate(CHILDREN):
        w.episodes[f"ep-c{index}"] = _child(f"ep-c{index}", address, index)
    assert w.gateway.logprobs_mode("reference") == "processed"
    count_generations(w)
    yield w, origins
    w.gateway.stop()
    model.stop()


@pytest.mark.timeout(120)
def test_fork_children_share_the_prefix_and_sample_their_own_first_turns(
    forked: tuple[World, dict[str, ForkOrigin]],
) -> None:
    world, origins = forked
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, USER]
    for _ in range(2):
        _step(world, messages, PARENT)
    prefix = world.ledger.turns("ep-p")
    cursor = world.ledger.cursor("ep-p")["turn"]
    assert cursor == prefix[-1].id
    for index in range(len(CHILDREN)):
        origins[f"ep-c{index}"] = ForkOrigin("ep-p", "snap-1", cursor)
    at_fork = list(messages)
    _step(world, messages, PARENT)  # the parent goes on past the snapshot
    after = world.ledger.turns("ep-p")[-1]
    calls = len(world.upstream_calls)

    # Each restored child asks what the parent asked after the snapshot: three fresh samples.
    conversations = [list(at_fork) for _ in CHILDREN]
    for address, conversation in zip(CHILDREN, conversations, strict=True):
        _step(world, conversation, address)
    assert len(world.upstream_calls) == calls + len(CHILDREN), "never replayed from the parent or a sibling"
    firsts = []
    for index in range(len(CHILDREN)):
        turns = world.ledger.turns(f"ep-c{index}")
        shared, own = turns[:2], turns[2:]
        assert [t.id for t in shared] == [t.id for t in prefix] and all(t.shared for t in shared)
        assert after.id not in {t.id for t in turns}, "the parent's turns past the cursor are not the child's"
        assert len(own) == 1 and not own[0].shared and own[0].episode_id == f"ep-c{index}"
        first = own[0]
        assert (first.parent_id, first.edge, first.edge_parent, first.branch) == (
            prefix[-1].id,
            "fork",
            prefix[-1].id,
            0,
        )
        assert first.prefix_exact is True
        assert first.prompt_token_ids[: len(prefix[-1].prompt_token_ids) + len(prefix[-1].token_ids)] == (
            prefix[-1].prompt_token_ids + prefix[-1].token_ids
        )
        main = world.ledger.branches(f"ep-c{index}")[0]
        assert [t.id for t in main.turns] == [*(t.id for t in prefix), first.id]
        assert_on_policy(turns, world.model.model)
        firsts.append(first)
    assert len({t.id for t in firsts}) == len(CHILDREN)
    assert len({tuple(t.token_ids) for t in firsts}) > 1, "siblings drew their own samples"
    assert [t.id for t in world.ledger.turns("ep-p")] == [*(t.id for t in prefix), after.id], (
        "the parent's own"
    )

    # The children train as one tree: the shared prefix once, each child's first turn on its path.
    members = [world.ledger.turns(f"ep-c{index}") for index in range(len(CHILDREN))]
    trees = fork_tree_samples(members)
    assert {s.tree for s in trees.streams} == {0} and len(trees.streams) == len(CHILDREN)
    assert [s.turn_ids for s in trees.streams] == [[*(t.id for t in prefix), f.id] for f in firsts]
    assert trees.dropped_turns == [] and trees.masked_turns == []
    n = len(CHILDREN)
    for rank, (stream, first) in enumerate(zip(trees.streams, firsts, strict=True)):
        assert stream.token_ids == first.prompt_token_ids + first.token_ids
        for turn, (start, end) in zip(prefix, stream.spans[:2], strict=True):
            assert stream.weights[start:end] == [1.0] * len(turn.token_ids), "held by every path"
            assert stream.loss_mask[start:end] == [int(rank == 0)] * len(turn.token_ids), "trained once"
            assert stream.logprobs[start:end] == turn.logprobs
        start, end = stream.spans[2]
        assert stream.weights[start:end] == [1 / n] * len(first.token_ids)
        assert stream.loss_mask[start:end] == [1] * len(first.token_ids)
        assert stream.logprobs[start:end] == first.logprobs, "the child's own samples"
    alone = tree_samples(members[0])
    assert [s.turn_ids for s in alone.streams] == [[*(t.id for t in prefix), firsts[0].id]]
    # Exported as the group they are, each stream is its child's row, with its reward.
    group = [
        ForkMember(
            f"ep-c{i}", turns, own=frozenset(t.id for t in turns if not t.shared), reward=i / n, group_index=i
        )
        for i, turns in enumerate(members)
    ]
    rows = fork_group_rows(group, parent_id="ep-p", group_id="g")
    assert [(r["episode_id"], r["reward"], r["group_index"], r["group_id"]) for r in rows] == [
        (f"ep-c{i}", i / n, i, "g") for i in range(n)
    ]
    assert [r["loss_mask"] for r in rows] == [s.loss_mask for s in trees.streams], "the prefix trained once"

    # A child's next turn continues its own: no other episode's turn is its parent.
    _step(world, conversations[0], CHILDREN[0])
    own = [t for t in world.ledger.turns("ep-c0") if not t.shared]
    assert [t.edge for t in own] == ["fork", "continuation"] and own[1].parent_id == own[0].id
    assert_on_policy(world.ledger.turns("ep-c0"), world.model.model)


@pytest.mark.timeout(120)
def test_a_turn_the_snapshot_froze_before_its_harness_had_it_is_asked_again_by_each_child(
    forked: tuple[World, dict[str, ForkOrigin]],
) -> None:
    """The parent's last turn before the snapshot was recorded while its harness still waited
    for it (the usual case: a harness spends its time waiting on the model). Each child asks it
    again and samples its own; in the child's trajectory the parent's answer, which its harness
    never had, reads abandoned on a branch of its own, and its own turn carries main on."""
    world, origins = forked
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, USER]
    _step(world, messages, PARENT)
    at_fork = list(messages)
    _step(world, messages, PARENT)
    waited_for = world.ledger.turns("ep-p")[-1]
    for index in range(2):
        origins[f"ep-c{index}"] = ForkOrigin("ep-p", "snap-1", world.ledger.cursor("ep-p")["turn"])
    calls = len(world.upstream_calls)
    for address in CHILDREN[:2]:
        _step(world, list(at_fork), address)
    assert len(world.upstream_calls) == calls + 2, "asked again: sampled for each child, not replayed"
    members = []
    for index in range(2):
        turns = world.ledger.turns(f"ep-c{index}")
        first, taken, own = turns
        assert first.shared and not first.abandoned and first.branch == 0
        assert taken.id == waited_for.id and taken.shared and taken.abandoned and taken.branch == 1
        assert not own.shared and (own.parent_id, own.edge, own.branch) == (first.id, "fork", 0)
        assert [t.id for t in world.ledger.branches(f"ep-c{index}")[0].turns] == [first.id, own.id]
        assert_on_policy(turns, world.model.model)
        members.append(turns)
    parent_view = world.ledger.turns("ep-p")
    assert not any(t.abandoned or t.shared for t in parent_view), "the parent's own trajectory is unchanged"
    trees = fork_tree_samples(members)
    assert trees.masked_turns == [waited_for.id]
    assert [s.turn_ids for s in trees.streams] == [[members[0][0].id, m[2].id] for m in members]
