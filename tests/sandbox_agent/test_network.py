"""The node's gateway allowances in the real iptables isolation chain."""

from __future__ import annotations

import pytest

from sandbox_agent import network
from tests import hostcheck


def _ports(node: str) -> set[str]:
    return {rule[rule.index("--dport") + 1] for rule in network.allowances(node)}


@pytest.mark.timeout(30)
def test_a_node_started_with_other_ports_closes_the_ones_it_no_longer_allows() -> None:
    before = network.allowances()
    try:
        network.prepare_node("net-a", [61001, 61002])
        network.prepare_node("net-b", [61002])
        assert _ports("net-a") == {"61001", "61002"}
        network.prepare_node("net-a", [61003])
        assert _ports("net-a") == {"61003"}, "a gateway that moved leaves no port open behind it"
        assert _ports("net-b") == {"61002"}, "another node's allowances stay"
        network.prepare_node("net-a", [61003])
        assert len(network.allowances("net-a")) == 1, "starting again adds nothing twice"
    finally:
        hostcheck.forget_allowances(before)
    assert _ports("net-a") == _ports("net-b") == set()
