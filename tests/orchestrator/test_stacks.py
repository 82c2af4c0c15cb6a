"""Stacks of `stasis up` side by side on one host: their names and address pools."""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

import pytest

from orchestrator.cli.local import LocalSettings, agent_command, claim_address_pool
from orchestrator.domain import FailedPrecondition


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
    assert not (tmp_path / "stacks" / a.stack).exists()
