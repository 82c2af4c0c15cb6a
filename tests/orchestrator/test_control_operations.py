"""An episode's operations on its nodes (`control/operations.py`, `commands.py`,
`outcomes.py`): start, preempt, resume elsewhere, a refusal and a retry.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

import time

import pytest

from orchestrator.control import AgentUnavailable, SpecRefused
from orchestrator.domain import ids
from tests.orchestrator.loops import SPEC, Loop, S


@pytest.mark.timeout(30)
def test_an_episode_starts_with_its_env_and_succeeds_when_the_harness_exits(loop: Loop) -> None:
    episode_id = loop.running()
    e = loop.store.episodes.get(episode_id)
    assert e.runs == 1 and e.sandbox_id == ids.sandbox_id(episode_id, 1)
    agent = loop.node(e.node)
    assert agent.env[e.sandbox_id]["STASIS_EPISODE_ID"] == episode_id
    agent.exit(e.sandbox_id, 0)
    loop.until("SUCCEEDED", lambda: loop.state(episode_id) == S.SUCCEEDED)
    assert ("delete", e.sandbox_id) in agent.calls
    assert loop.store.episodes.get(episode_id).exit_code == 0


@pytest.mark.timeout(30)
def test_preempt_records_the_agents_snapshot_and_resume_restores_it_elsewhere(loop: Loop) -> None:
    episode_id = loop.running()
    first = loop.store.episodes.get(episode_id)
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    held = loop.store.episodes.get(episode_id)
    assert held.held and held.node == "" and held.last_snapshot_id == ids.snapshot_id(episode_id, 1)
    (record,) = loop.store.snapshots.of(episode_id)
    assert record.timings_ms == {"dump_ms": 12.5, "put_ms": 3.0}, "the agent's own figures"
    assert record.reason == "manual" and record.node == first.node and record.stored_bytes > 0

    other = "node-2" if first.node == "node-1" else "node-1"
    loop.control.commands.resume(episode_id, other)
    loop.until("RUNNING again", lambda: loop.state(episode_id) == S.RUNNING)
    e = loop.store.episodes.get(episode_id)
    assert (e.node, e.runs, e.restored_from) == (other, 2, record.id)
    assert e.pinned_node == "", (
        "the pin ends with its placement: were that node lost, any other may resume it"
    )
    assert e.sandbox_id == ids.sandbox_id(episode_id, 2)
    assert loop.node(other).sandboxes[e.sandbox_id].restored_from == record.id


@pytest.mark.timeout(30)
def test_a_snapshot_is_dated_by_the_orchestrators_clock_whatever_the_nodes_says(loop: Loop) -> None:
    """When a snapshot froze its sandbox is compared with when turns were delivered, which the
    orchestrator's clock stamps: a node whose clock is an hour ahead must not move the freeze."""
    episode_id = loop.running()
    loop.node(loop.store.episodes.get(episode_id).node).clock_skew_s = 3600.0
    asked = time.time()
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    (record,) = loop.store.snapshots.of(episode_id)
    assert asked - 1 <= record.created_at <= time.time(), record.created_at - asked


@pytest.mark.timeout(30)
def test_a_refused_spec_fails_at_once_and_an_unreachable_node_is_retried_after_its_delay(loop: Loop) -> None:
    for agent in loop.agents.agents.values():
        agent.fail["create"] = SpecRefused(agent.node, "spec.image: no such image")
    refused = loop.store.episodes.submit(SPEC, "", loop.control.pool_of_addresses)
    loop.until("FAILED", lambda: loop.state(refused.id) == S.FAILED)
    assert "no such image" in loop.store.episodes.get(refused.id).reason
    assert loop.store.episodes.get(refused.id).attempts == 0, "not retried"

    for agent in loop.agents.agents.values():
        agent.fail["create"] = AgentUnavailable("agent restarting", delay=60)
    asked_at = time.time()
    waiting = loop.store.episodes.submit(SPEC, "", loop.control.pool_of_addresses)
    loop.until("a failed attempt", lambda: loop.store.episodes.get(waiting.id).attempts == 1)
    e = loop.store.episodes.get(waiting.id)
    assert e.state == S.PENDING and e.node == ""
    assert e.not_before >= asked_at + 60, "the backoff honours the agent's delay"
