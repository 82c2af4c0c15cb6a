"""The node's gateway allowances in the real iptables isolation chain."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_agent.errors import AlreadyExists, FailedPrecondition
from sandbox_agent.host import network
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


@pytest.mark.timeout(30)
def test_a_sandbox_netns_has_tcp_tables_of_its_own_and_no_ipv6() -> None:
    """Its own TCP hash table (CRIU's dump walks only it), no IPv6 on any link (eth0 takes the
    netns's defaults), low ports for its root; and nothing of it is left once destroyed."""
    node, sandbox = "net-own", "tables"
    netns = network.create(node, sandbox, "10.254.77.8")
    try:

        def sysctl(name: str) -> str:
            done = subprocess.run(["ip", "netns", "exec", netns.name, "sysctl", "-n", name],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            return done.stdout.strip()

        assert sysctl("net.ipv4.tcp_ehash_entries") == str(network.TCP_EHASH_ENTRIES)
        for link in ("all", "default", "lo", "eth0"):
            assert sysctl(f"net.ipv6.conf.{link}.disable_ipv6") == "1", link
        assert sysctl("net.ipv4.ip_unprivileged_port_start") == "0"
        # Wired over netlink as `ip` wired it: the same links, address and routes on both sides.
        host_side = network.veth_name(node, sandbox)
        inside = _ip("-n", netns.name, "-4", "-o", "addr", "show", "dev", "eth0")
        assert "inet 10.254.77.8/32 scope global eth0" in inside
        assert _ip("-n", netns.name, "-4", "route", "show").splitlines() == [
            f"default via {network.GATEWAY_IP} dev eth0 ",
            f"{network.GATEWAY_IP} dev eth0 scope link ",
        ]
        for side, show in (("lo", ["-n", netns.name]), ("eth0", ["-n", netns.name]), (host_side, [])):
            assert ",UP" in _ip(*show, "-o", "link", "show", "dev", side), side
        assert (
            _ip("-4", "route", "show", "10.254.77.8/32").strip() == f"10.254.77.8 dev {host_side} scope link"
        )
        conf = Path(f"/proc/sys/net/ipv4/conf/{host_side}/proxy_arp")
        assert conf.read_text().strip() == "1"
        assert Path(f"/proc/sys/net/ipv6/conf/{host_side}/disable_ipv6").read_text().strip() == "1"
    finally:
        network.destroy(node, sandbox)
    assert not netns.exists()
    _gone(network.veth_name(node, sandbox), "10.254.77.8")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("again", ["same", "other"])
def test_a_sandbox_given_a_destroyed_ones_address_gets_its_network(again: str) -> None:
    """The kernel removes a destroyed sandbox's veth and route with its netns, once nothing holds
    that (here an open handle does, as a socket left closing would): a sandbox of the same id,
    or another given the same address, made meanwhile gets a veth and the route of its own."""
    node, address = "net-again", "10.254.77.10"
    network.create(node, "first", address)
    first_veth = network.veth_name(node, "first")
    held = os.open(network.netns_path(node, "first"), os.O_RDONLY)
    try:
        network.destroy(node, "first")
        assert Path(f"/sys/class/net/{first_veth}").exists(), "the netns, held, keeps its veth"
        sandbox = "first" if again == "same" else "second"
        made = network.create(node, sandbox, address)
        host_side = network.veth_name(node, sandbox)
        try:
            assert made.exists()
            route = _ip("-4", "route", "show", f"{address}/32").strip()
            assert route == f"{address} dev {host_side} scope link"
            assert f"inet {address}/32" in _ip("-n", made.name, "-4", "-o", "addr", "show", "dev", "eth0")
            if again == "other":
                assert not Path(f"/sys/class/net/{first_veth}").exists(), "the old veth made way"
        finally:
            network.destroy(node, sandbox)
    finally:
        os.close(held)
    _gone(network.veth_name(node, sandbox), address)
    _gone(first_veth, address)


def _gone(host_side: str, address: str, timeout_s: float = 5.0) -> None:
    """The veth and its route go with the netns, in the kernel's background."""
    deadline = time.monotonic() + timeout_s
    while Path(f"/sys/class/net/{host_side}").exists() or network._routed(address):
        assert time.monotonic() < deadline, f"veth {host_side} or the route to {address} was left"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_a_refused_link_names_the_kernels_reason_and_leaves_nothing() -> None:
    """A veth the kernel refuses (an MTU above any link's) fails with the request and the
    kernel's error, and undoes what was made before it: the netns."""
    node, sandbox = "net-refused", "mtu"
    with pytest.raises(FailedPrecondition, match=r"making veth eth0 with peer stx\w+: Invalid argument"):
        network.create(node, sandbox, "10.254.77.9", mtu=1 << 20)
    assert not network.netns_path(node, sandbox).exists()
    assert not Path(f"/sys/class/net/{network.veth_name(node, sandbox)}").exists()
    assert not network._routed("10.254.77.9")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
