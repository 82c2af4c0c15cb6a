"""Cluster mode: the node relays 169.254.1.1:<gateway port> to a gateway elsewhere."""

from __future__ import annotations

import socket
import threading

import pytest

from orchestrator.cli.local import free_port
from sandbox_agent import SandboxSpec
from sandbox_agent.server.forwarder import Forwarder, parse_target
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
