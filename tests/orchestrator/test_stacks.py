"""Stacks of `stasis up` side by side on one host: their names and address pools."""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.local import LocalSettings, LocalStack, agent_command, claim_address_pool
from orchestrator.domain import FailedPrecondition
from tests.orchestrator.programs import counter_spec


def _settings(tmp_path: Path, name: str, pool: str = "") -> LocalSettings:
    state_dir = tmp_path / name
    state_dir.mkdir(exist_ok=True)
    return LocalSettings(state_dir=state_dir, address_pool=pool, stacks_dir=tmp_path / "stacks")


def test_stacks_on_one_host_get_their_own_names_and_disjoint_address_pools(tmp_path: Path) -> None:
    a, b = _settings(tmp_path, "a"), _settings(tmp_path, "b")
    assert a.stack != b.stack and "." not in a.stack
    assert agent_command(a, "node-1", "127.0.0.1:1")[5:7] == ["--stack", a.stack]
    pool_a, pool_b = claim_address_pool(a), claim_address_pool(b)
    assert not ipaddress.ip_network(pool_a).overlaps(ipaddress.ip_network(pool_b))
    assert ipaddress.ip_network(pool_a).subnet_of(ipaddress.ip_network("10.200.0.0/16"))
    assert claim_address_pool(a) == pool_a, (
        "a stack started again keeps its pool: its episodes hold addresses"
    )
    with pytest.raises(FailedPrecondition, match=r"10\.200\.0\.0/16 overlaps 10\.200\."):
        claim_address_pool(_settings(tmp_path, "c", pool="10.200.0.0/16"))
    assert claim_address_pool(_settings(tmp_path, "d", pool="10.77.0.0/24")) == "10.77.0.0/24"
    shutil.rmtree(a.state_dir)  # that stack is gone, and its pool is free
    assert claim_address_pool(_settings(tmp_path, "e")) == pool_a
    assert not a.pool_claim.exists()


def test_a_stack_keeps_its_name_and_one_from_before_names_had_none(tmp_path: Path) -> None:
    """A state dir's stack is named at its first start and keeps that name; one whose nodes ran
    before stacks were named keeps none, so its agents find the sandboxes still running."""
    fresh = _settings(tmp_path, "fresh")
    name = fresh.stack
    (fresh.state_dir / "nodes" / "node-1" / "sandboxes").mkdir(parents=True)
    assert name and _settings(tmp_path, "fresh").stack == name
    older = _settings(tmp_path, "older")
    (older.state_dir / "nodes" / "node-1" / "sandboxes").mkdir(parents=True)
    assert older.stack == "" and _settings(tmp_path, "older").stack == ""


@pytest.mark.timeout(240)
def test_a_second_stack_started_beside_a_running_episode_leaves_it_running(
    make_stack: Callable[..., LocalStack],
) -> None:
    """Two `stasis up` on one host, each with a node-1: the second's start-up leaves the first's
    sandbox running, and both run an episode at once, at addresses of their own."""
    first = make_stack(nodes=1, slots=1)
    with first.client() as a:
        one = a.wait(a.submit(counter_spec(60)).id, ["RUNNING"], timeout_s=60)
        second = make_stack(nodes=1, slots=1)
        with second.client() as b:
            two = b.wait(b.submit(counter_spec(20)).id, ["RUNNING"], timeout_s=60)
            assert one.node == two.node == "node-1"
            assert one.address != two.address
            assert a.get(one.id).state == "RUNNING"
            assert b.wait(two.id, ["SUCCEEDED"], timeout_s=60).exit_code == 0
        assert a.wait(one.id, ["SUCCEEDED"], timeout_s=60).exit_code == 0
        moves = [(e.from_state, e.to_state) for e in a.events(one.id) if e.kind == "transition"]
        assert moves[-1] == ("RUNNING", "SUCCEEDED") and ("RUNNING", "FAILED") not in moves, moves
        assert len([m for m in moves if m[1] == "RUNNING"]) == 1, f"it started over: {moves}"
