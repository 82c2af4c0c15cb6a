"""The node's gateway allowances in the real iptables isolation chain."""

from __future__ import annotations

import subprocess

import pytest

from sandbox_agent import network
from sandbox_agent.errors import AlreadyExists
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


@pytest.mark.timeout(30)
def test_a_sandbox_network_is_refused_where_its_address_or_netns_is_taken() -> None:
    """An address routed here, or a netns of the sandbox's name left by someone, is named in the
    error, and whatever held them stays as it was."""
    node, sandbox = "net-taken", "twice"
    address = "10.254.77.7"
    netns = network.netns_path(node, sandbox)
    subprocess.run(["ip", "route", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        with pytest.raises(AlreadyExists, match=f"address {address} is already routed"):
            network.create(node, sandbox, address)
        assert address in subprocess.run(["ip", "-4", "route", "show", f"{address}/32"],
                                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    finally:
        subprocess.run(["ip", "route", "del", f"{address}/32", "dev", "lo"], check=True)
    subprocess.run(["ip", "netns", "add", netns.name], check=True)
    try:
        with pytest.raises(AlreadyExists, match=f"network namespace {netns.name} of sandbox 'twice'"):
            network.create(node, sandbox, address)
        assert netns.exists()
        assert not network._routed(address), "nothing of the refused sandbox is left"
    finally:
        subprocess.run(["ip", "netns", "del", netns.name], check=True)
