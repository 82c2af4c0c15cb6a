"""The nodes' TLS port (`gateway/relay.py`, `authentication.py`): a node's relay
for its sandboxes, heard only with its node's certificate and only for the episodes placed on it.

Against the real reference model, spoken to with raw HTTP and with the official openai and
anthropic SDKs (`worlds.World`); the `world` tests run with the ledger in SQLite and in
PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from orchestrator.cli.pki import ClusterPki
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from protos.shared.tls import ORCHESTRATOR, TlsFiles, certified_identity
from sandbox_agent.server.forwarder import Forwarder
from tests.orchestrator.worlds import USER, World, chat_body, count_generations, make_world


@pytest.fixture
def tls_world(tmp_path: Path) -> Iterator[tuple[World, ClusterPki]]:
    """A gateway that nodes relay to, as `stasis server` with the cluster's TLS serves it."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    pki = ClusterPki(tmp_path / "pki")
    w = make_world(tmp_path, model.url, model, tls=pki.orchestrator())
    assert w.gateway.logprobs_mode("reference") == "processed"
    count_generations(w)
    yield w, pki
    w.gateway.stop()
    w.ledger.close()
    model.stop()


def _relayed(
    world: World, context: ssl.SSLContext | None, body: Any, source: str = "127.0.0.1"
) -> tuple[int, bytes] | None:
    """POST as a node's relay would: over TLS with `context` (None: plaintext). None when the
    gateway gives no HTTP answer (the handshake, or the connection, was refused)."""
    sock = socket.create_connection(("127.0.0.1", world.gateway.port), timeout=10, source_address=(source, 0))
    conn = http.client.HTTPConnection("127.0.0.1", world.gateway.port, timeout=10)
    try:
        # The handshake takes the socket over; a refused one leaves it to be closed here.
        conn.sock = context.wrap_socket(sock, server_hostname=ORCHESTRATOR) if context is not None else sock
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"Authorization": "Bearer tok-1", "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):  # ssl.SSLError is an OSError
        return None
    finally:
        conn.close()
        sock.close()


def _no_certificate(pki: ClusterPki) -> ssl.SSLContext:
    """TLS that checks the gateway's certificate but presents none of its own."""
    return ssl.create_default_context(cafile=pki.ca_cert)


@pytest.mark.timeout(60)
def test_the_nodes_port_refuses_a_relay_without_a_node_certificate_and_records_nothing(
    tls_world: tuple[World, ClusterPki], tmp_path: Path
) -> None:
    world, pki = tls_world
    foreign = ClusterPki(tmp_path / "foreign").node("node-1")  # the right name, from another CA
    assert _relayed(world, None, chat_body(USER)) is None, "plaintext"
    assert _relayed(world, _no_certificate(pki), chat_body(USER)) is None, "TLS without a certificate"
    forged = TlsFiles(pki.ca_cert, foreign.cert, foreign.key).client_context()
    assert _relayed(world, forged, chat_body(USER)) is None, "a certificate from a foreign CA"
    named_no_node = _relayed(world, pki.orchestrator().client_context(), chat_body(USER))
    assert named_no_node is not None and named_no_node[0] == 409, "a certificate naming no node"
    assert world.ledger.turns("ep-1") == [] and world.upstream_calls == [], "nothing recorded"
    assert _relayed(world, pki.node("node-1").client_context(), chat_body(USER)) == (200, ANY), (
        "node-1's relay"
    )
    assert len(world.ledger.turns("ep-1")) == 1


@pytest.mark.timeout(60)
def test_a_nodes_certificate_relays_only_for_the_episodes_placed_on_it(
    tls_world: tuple[World, ClusterPki],
) -> None:
    """Over TLS the certificate, not the address, says which node relays: node-2's certificate
    from node-1's address gets 409, and node-1's from anywhere is heard."""
    world, pki = tls_world
    node_1, node_2 = pki.node("node-1").client_context(), pki.node("node-2").client_context()
    refused = _relayed(world, node_2, chat_body(USER), source="127.0.0.1")
    assert refused is not None and refused[0] == 409, refused
    assert b"node node-2 at 127.0.0.1" in refused[1] and b"nothing is recorded" in refused[1], refused
    assert world.ledger.turns("ep-1") == [] and world.upstream_calls == [], "nothing recorded"
    assert _relayed(world, node_1, chat_body(USER), source="127.0.0.2") == (200, ANY), (
        "node-1, from node-2's address"
    )
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], node="node-2", runs=2)
    moved = _relayed(world, node_1, chat_body(USER, seed=2))
    assert moved is not None and moved[0] == 409, "the episode moved: node-1's stale sandbox"
    assert len(world.ledger.turns("ep-1")) == 1 and len(world.upstream_calls) == 1
    assert _relayed(world, node_2, chat_body(USER, seed=2)) == (200, ANY), "node-2, where it runs now"


class _Tap:
    """An on-path relay between a node and the gateway that keeps every byte it passes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                a, _ = self.sock.accept()
                b = socket.create_connection(self.target)
                for src, dst in ((a, b), (b, a)):
                    threading.Thread(target=self._copy, args=(src, dst), daemon=True).start()

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self.seen += data
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        src.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.timeout(60)
def test_a_nodes_relay_to_the_gateway_is_tls_and_an_on_path_tap_reads_no_key_or_turn(
    tls_world: tuple[World, ClusterPki],
) -> None:
    world, pki = tls_world
    tap = _Tap(("127.0.0.1", world.gateway.port))
    relay = Forwarder(("127.0.0.1", 0), tap.address, tls=pki.node("node-1")).start()
    try:
        conn = http.client.HTTPConnection(*relay.address, timeout=30)  # the sandbox's hop: plain HTTP
        conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(USER)).encode(),
                     {"Authorization": "Bearer tok-1", "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        status, answer = response.status, response.read()
        conn.close()
    finally:
        relay.stop()
        tap.close()
    assert status == 200, answer
    assert len(world.ledger.turns("ep-1")) == 1
    seen = bytes(tap.seen)
    assert seen[:1] == b"\x16", "a TLS handshake record opens the connection"
    said = str(json.loads(answer)["choices"][0]["message"].get("content") or "")
    words = [w.encode() for w in said.split() if len(w) > 4][:5]
    answer_id = str(json.loads(answer)["id"]).encode()
    for secret in (b"tok-1", b"Bearer", b"Make a notes file", b"chat.completion", answer_id, *words):
        assert secret not in seen, f"{secret!r} crossed the wire in plaintext"


@pytest.mark.timeout(60)
def test_a_kept_alive_harness_waits_out_no_delayed_ack_through_the_tls_relay(
    tls_world: tuple[World, ClusterPki],
) -> None:
    """A reply crosses the relay in two TLS records (head, body): were Nagle left on towards the
    harness, the second would wait for its delayed ACK, 40 ms a turn. Replays, so the model's
    time is not measured."""
    world, pki = tls_world
    relay = Forwarder(("127.0.0.1", 0), ("127.0.0.1", world.gateway.port), tls=pki.node("node-1")).start()
    conn = http.client.HTTPConnection(*relay.address, timeout=30)
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        took = []
        for _ in range(21):
            started = time.monotonic()
            conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(USER)).encode(),
                         {"Authorization": "Bearer tok-1", "Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
            took.append(time.monotonic() - started)
    finally:
        conn.close()
        relay.stop()
    # A delayed ACK holds each turn at least 40 ms; a turn through the relay otherwise takes a few
    # ms alone, and up to about 20 ms on a machine busy with the rest of the suite.
    median = sorted(took[1:])[10]
    assert median < 0.03, f"median turn {median * 1000:.1f} ms through the relay: a delayed ACK in each"


def _through(relay: Forwarder, body: Any) -> tuple[int, bytes]:
    """POST as a sandbox does, to its node's relay: plain HTTP."""
    conn = http.client.HTTPConnection(*relay.address, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"Authorization": "Bearer tok-1", "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_the_relay_presents_the_certificate_its_node_renewed_from_the_next_connection(
    tls_world: tuple[World, ClusterPki], tmp_path: Path
) -> None:
    """A joined node's certificate is replaced every day or so while its agent runs: the relay
    dials with whatever its files hold. Here they come to name node-2, which the gateway then
    hears, not node-1."""
    world, pki = tls_world
    mine = TlsFiles(pki.ca_cert, tmp_path / "node.crt", tmp_path / "node.key")
    first, renewed = pki.node("node-1"), pki.node("node-2")
    for src, dst in ((first.cert, mine.cert), (first.key, mine.key)):
        dst.write_bytes(src.read_bytes())
    relay = Forwarder(("127.0.0.1", 0), ("127.0.0.1", world.gateway.port), tls=mine).start()
    try:
        assert _through(relay, chat_body(USER))[0] == 200
        for src, dst in ((renewed.key, mine.key), (renewed.cert, mine.cert)):
            dst.with_suffix(".new").write_bytes(src.read_bytes())
            dst.with_suffix(".new").replace(dst)
        status, answer = _through(relay, chat_body(USER, seed=2))
    finally:
        relay.stop()
    assert status == 409 and b"node node-2" in answer, (status, answer)


def test_a_certificate_that_expired_on_a_kept_alive_connection_names_no_node() -> None:
    subject = ((("commonName", "node-1.node.stasis"),),)
    assert (
        certified_identity({"subject": subject, "notAfter": "Jan  1 00:00:00 2999 GMT"})
        == "node-1.node.stasis"
    )
    assert certified_identity({"subject": subject, "notAfter": "Jan  1 00:00:00 2020 GMT"}) == ""
