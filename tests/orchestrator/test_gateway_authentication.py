"""Who the gateway hears (`gateway/authentication.py`, `door.py`): only an
episode's live run, and no peer holding every connection.

Against the real reference model, spoken to with raw HTTP and with the official openai and
anthropic SDKs (`worlds.World`); the `world` tests run with the ledger in SQLite and in
PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.domain import EpisodeState
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.worlds import USER, World, chat_body, count_generations, make_world


@pytest.mark.timeout(30)
def test_only_the_live_run_is_heard_and_a_stale_sandbox_gets_409(world: World) -> None:
    assert world.post(chat_body(USER))[0] == 200, "from node-1, where the episode runs"
    # The episode moved to node-2 (its first node was declared lost): node-1's sandbox is stale.
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], node="node-2", runs=2)
    status, body = world.post(chat_body(USER, seed=2))
    assert status == 409 and b"is not its live run" in body and b"conflict_error" in body, body
    assert len(world.ledger.turns("ep-1")) == 1 and len(world.upstream_calls) == 1, "nothing recorded"
    assert world.post(chat_body(USER, seed=2), source="127.0.0.2")[0] == 200, "from node-2's relay"
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], state=EpisodeState.PREEMPTED)
    status, body = world.post(chat_body(USER, seed=3), source="127.0.0.2")
    assert status == 409 and b"PREEMPTED" in body, "a preempted episode has no live run"
    assert len(world.ledger.turns("ep-1")) == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_that_outlives_its_episode_is_refused_and_not_recorded(
    world: World, stream: bool
) -> None:
    """The episode is cancelled while its turn generates: the record re-reads the episode, so the
    turn joins no trajectory that has ended, and the harness hears 409 (no terminal event)."""
    world.upstream_calls.clear()
    count_generations(world, delay_s=1.0)
    replies: list[tuple[int, bytes]] = []
    asking = threading.Thread(
        target=lambda: replies.append(world.post({**chat_body(USER), "stream": stream}))
    )
    asking.start()
    wait_until(lambda: world.upstream_calls, 10, "the generation to begin")
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], state=EpisodeState.CANCELLED)
    asking.join()
    ((status, body),) = replies
    assert b"has ended (CANCELLED)" in body and b"nothing is recorded" in body, body
    assert status == (200 if stream else 409), "a stream's status went out with its first event"
    if stream:
        assert b"[DONE]" not in body and b'finish_reason":"stop' not in body
    assert world.ledger.turns("ep-1") == []


@pytest.mark.timeout(60)
def test_one_peer_cannot_take_every_connection(world: World, tmp_path: Path) -> None:
    bounded = make_world(
        tmp_path / "bounded", world.model.url, world.model, max_connections=5, max_connections_per_peer=3
    )
    held: list[socket.socket] = []
    closed = 0

    def settled() -> None:
        """Wait until the gateway holds exactly the connections held here (the loop admits and
        drops them on its own thread)."""
        wait_until(lambda: bounded.gateway.connections == len(held) - closed, 10, "the gateway to settle")

    def hold(source: str) -> socket.socket:
        sock = socket.create_connection(
            ("127.0.0.1", bounded.gateway.port), timeout=10, source_address=(source, 0)
        )
        held.append(sock)
        settled()
        return sock

    def refusal(source: str) -> str:
        sock = socket.create_connection(
            ("127.0.0.1", bounded.gateway.port), timeout=10, source_address=(source, 0)
        )
        with sock:
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable") and b"Retry-After: 1" in head, answer
        return str(json.loads(body)["error"]["message"])

    try:
        first = hold("127.0.0.1")
        for _ in range(2):
            hold("127.0.0.1")
        assert "127.0.0.1 holds 3 connections" in refusal("127.0.0.1")
        assert bounded.post(chat_body(USER), token="nobody", source="127.0.0.3")[0] == 401, (
            "another peer gets in"
        )
        settled()
        hold("127.0.0.3")
        hold("127.0.0.4")
        assert "holds 5 connections" in refusal("127.0.0.5")
        first.close()
        closed += 1
        settled()
        assert bounded.post(chat_body(USER))[0] == 200, "a closed connection frees its place"
        assert len(bounded.ledger.turns("ep-1")) == 1, "nothing refused was recorded"
    finally:
        for sock in held:
            sock.close()
        bounded.gateway.stop()
        bounded.ledger.close()
