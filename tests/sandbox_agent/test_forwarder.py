"""Cluster mode: the node relays 169.254.1.1:<gateway port> to a gateway elsewhere."""

from __future__ import annotations

import socket
import threading

import pytest

from orchestrator.cli.local import free_port
from sandbox_agent import SandboxSpec
from sandbox_agent.server.forwarder import Forwarder, parse_target
from tests.orchestrator.conftest import wait_until
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log

CLIENT = r"""
import socket, sys
s = socket.create_connection(("169.254.1.1", int(sys.argv[1])), timeout=5)
s.sendall(b"hello gateway\n")
print("echo:", s.recv(64).decode().strip(), flush=True)
"""


@pytest.mark.timeout(60)
def test_sandbox_reaches_a_remote_gateway_through_the_node(make_node: NodeFactory) -> None:
    gateway = socket.create_server(("127.0.0.1", 0))

    def echo_once() -> None:
        conn, _ = gateway.accept()
        with conn:
            conn.sendall(conn.recv(64).upper())

    threading.Thread(target=echo_once, daemon=True).start()
    port = free_port()
    node = make_node("node-a", allowed_ports=(port,))
    relay = Forwarder(("169.254.1.1", port), gateway.getsockname()[:2]).start()
    try:
        node.create(
            "fwd",
            SandboxSpec(image="base", command=("python3", "-c", CLIENT, str(port)), address="10.204.0.2"),
        )
        assert "echo: HELLO GATEWAY" in wait_for_log(node, "fwd", lambda t: "echo:" in t)
    finally:
        relay.stop()
        gateway.close()


def test_target_must_be_host_and_port() -> None:
    assert parse_target("stasis:8080") == ("stasis", 8080)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_target("stasis")


@pytest.mark.timeout(30)
def test_one_sandbox_cannot_take_the_relays_share_of_its_neighbours() -> None:
    """The gateway sees the node's address for every sandbox on it: the relay caps the
    connections each sandbox holds, answers one more with 503, and frees its place when one
    ends; another sandbox is served meanwhile."""
    gateway = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(
        target=lambda: [accepted.append(gateway.accept()[0]) for _ in range(4)], daemon=True
    ).start()
    relay = Forwarder(("127.0.0.1", 0), gateway.getsockname()[:2], max_per_sandbox=2).start()
    address = relay.address
    held = [socket.create_connection(address, timeout=5) for _ in range(2)]
    try:
        wait_until(lambda: relay.held("127.0.0.1") == 2, 5, "two relayed connections")
        refused = socket.create_connection(address, timeout=5)
        answer = refused.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"holds 2 connections" in answer
        assert refused.recv(4096) == b"", "and closed"
        refused.close()
        neighbour = socket.create_connection(address, timeout=5, source_address=("127.0.0.2", 0))
        wait_until(lambda: relay.held("127.0.0.2") == 1, 5, "the neighbour relayed")
        held.pop().close()
        wait_until(lambda: relay.held("127.0.0.1") == 1, 5, "the place freed")
        held.append(socket.create_connection(address, timeout=5))
        wait_until(lambda: relay.held("127.0.0.1") == 2, 5, "a new connection in its place")
        neighbour.close()
    finally:
        for s in held:
            s.close()
        for s in accepted:
            s.close()
        relay.stop()
        gateway.close()
