"""The node's gateway allowances in the real iptables isolation chain."""

from __future__ import annotations

import pytest

from sandbox_agent import network


def _ports(node: str) -> set[str]:
    return {rule[rule.index("--dport") + 1] for rule in network.allowances(node)}


@pytest.mark.timeout(30)
def test_a_node_started_with_other_ports_closes_the_ones_it_no_longer_allows() -> None:
    try:
        network.prepare_node("net-a", [61001, 61002])
        network.prepare_node("net-b", [61002])
        assert _ports("net-a") == {"61001", "61002"}
        network.prepare_node("net-a", [61003])
        assert _ports("net-a") == {"61003"}, "a gateway that moved leaves no port open behind it"
        assert _ports("net-b") == {"61002"}, "another node's allowances stay"
        network.prepare_node("net-a", [61003])
        assert len(network.allowances("net-a")) == 1, "starting again adds nothing twice"
        network.forget_node("net-a")
        assert _ports("net-a") == set() and _ports("net-b") == {"61002"}
    finally:
        network.forget_node("net-a")
        network.forget_node("net-b")
