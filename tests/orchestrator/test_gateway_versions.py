"""Policy versions at the gateway: the version a turn records, and a group
member's staleness bound, held before its turn is sampled.

Against the real reference model, spoken to with raw HTTP and with the official openai and
anthropic SDKs (`worlds.World`); the `world` tests run with the ledger in SQLite and in
PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from orchestrator.trajectory.samples import samples
from tests.orchestrator.ledgers import OpenLedger
from tests.orchestrator.worlds import USER, chat_body, count_generations, make_world


@pytest.mark.timeout(60)
def test_a_turn_without_a_version_header_records_the_version_published_when_its_sampling_began(
    tmp_path: Path, open_ledger: OpenLedger, caplog: pytest.LogCaptureFixture
) -> None:
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    # The reference model names its version in x-policy-version: a header it never sends stands
    # in for a model server that names none.
    world = make_world(tmp_path, model.url, model, open_ledger(), policy_version_header="x-not-sent",
                       metrics_listen="127.0.0.1:0")  # fmt: skip
    try:
        policy, metrics = world.ledger.policy, world.gateway.metrics
        with caplog.at_level("WARNING", logger="orchestrator.gateway.recording"):
            assert world.post(chat_body(USER, seed=1))[0] == 200
            assert world.post(chat_body(USER, seed=2, stream=True))[0] == 200
        first, second = world.ledger.turns("ep-1")
        assert first.policy_version == second.policy_version == "", "neither named nor published"
        assert metrics.value("policy_version_unknown") == 2
        warned = [r for r in caplog.records if "no policy version" in r.getMessage()]
        assert len(warned) == 1 and "ep-1" in warned[0].getMessage(), "warned once per episode"
        scraped = urllib.request.urlopen(
            f"http://127.0.0.1:{world.gateway.metrics_port}/metrics", timeout=10
        ).read()
        assert b"stasis_gateway_policy_version_unknown_total 2" in scraped

        policy.publish(7)
        answer = type(world.model.model).chat_answer

        def published_meanwhile(body: Any) -> Any:
            """A trainer publishes its next version while the generation runs."""
            policy.publish(policy.published() + 1)
            return answer(world.model.model, body)

        world.model.model.chat_answer = published_meanwhile  # type: ignore[method-assign]
        assert world.post(chat_body(USER, seed=3))[0] == 200
        assert world.post(chat_body(USER, seed=4, stream=True))[0] == 200
        whole, streamed = world.ledger.turns("ep-1")[2:]
        assert (whole.policy_version, streamed.policy_version) == ("7", "8"), "not the one published after"
        assert policy.published() == 9
        assert metrics.value("policy_version_unknown") == 2
        sample = samples([whole], policy.published())[0]
        assert {s for s, known in zip(sample.staleness, sample.staleness_known, strict=True) if known} == {2}
    finally:
        world.gateway.stop()
        model.stop()


@pytest.mark.timeout(60)
def test_a_members_turn_past_its_groups_max_staleness_is_held_back_unsampled_and_unrecorded(
    tmp_path: Path, open_ledger: OpenLedger
) -> None:
    """ep-1 is member 0 of a group with max_staleness 1; its turns record the published version."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    world = make_world(tmp_path, model.url, model, open_ledger(), policy_version_header="x-not-sent",
                       max_staleness=lambda e: 1 if e.group_id == "g-1" else None)  # fmt: skip
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], group_id="g-1", group_index=0)
    anthropic_body = {"model": "reference", "max_tokens": 20, "messages": [USER]}
    try:
        count_generations(world)
        policy = world.ledger.policy
        assert world.post(chat_body(USER, seed=1))[0] == 200, "nothing published: nothing is stale"
        policy.publish(1)
        assert world.post(chat_body(USER, seed=2))[0] == 200
        policy.publish(2)
        assert world.post(chat_body(USER, seed=3))[0] == 200, (
            "its oldest ordered tokens lag 1: within the bound"
        )
        assert [t.policy_version for t in world.ledger.turns("ep-1")] == ["", "1", "2"]
        calls = len(world.upstream_calls)

        policy.publish(3)  # version 1's tokens would now lag 2
        status, body = world.post(chat_body(USER, seed=4))
        error = json.loads(body)["error"]
        assert status == 503 and error["type"] == "overloaded_error"
        for words in ("group g-1, member 0", "stale-bounded", "2 policy versions behind the published version 3",
                      "max_staleness 1", "held back unsampled and nothing is recorded"):  # fmt: skip
            assert words in error["message"], error["message"]
        status, body = world.post(anthropic_body, path="/v1/messages")
        assert status == 503 and json.loads(body)["error"]["type"] == "overloaded_error"
        status, _ = world.post(chat_body(USER, seed=5, stream=True))
        assert status == 503, "a stream is refused before its headers"
        assert len(world.ledger.turns("ep-1")) == 3 and len(world.upstream_calls) == calls, "never sampled"
        assert world.gateway.metrics.value("stale_held") == 3

        # What the control loop does: the member's turns are abandoned and it runs from the start.
        assert world.ledger.start_over("ep-1") == 3
        world.set_run("ep-1", 2, 0.0)
        status, body = world.post(chat_body(USER, seed=1))
        assert status == 200 and len(world.upstream_calls) == calls + 1, "sampled afresh, not replayed"
        fresh = world.ledger.turns("ep-1")[-1]
        assert (fresh.policy_version, fresh.branch, fresh.edge, fresh.abandoned) == ("3", 0, "root", False)
        assert all(t.abandoned and t.branch > 0 for t in world.ledger.turns("ep-1")[:3])

        # The same lag in no group, or in a group with no bound, is not held back.
        policy.publish(9)
        for group in ("", "g-unbounded"):
            world.episodes["ep-1"] = replace(world.episodes["ep-1"], group_id=group)
            assert world.post(chat_body(USER, seed=6 + len(group)))[0] == 200
    finally:
        world.gateway.stop()
        model.stop()
