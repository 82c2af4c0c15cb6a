"""Every protocol the gateway serves (`gateway/protocols/`, `upstream.py`), whole
and streamed; each protocol's own refusals, and a model server that fails.

Against the real reference model, spoken to with raw HTTP and with the official openai and
anthropic SDKs (`worlds.World`); the `world` tests run with the ledger in SQLite and in
PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from tests.orchestrator.worlds import (
    ANTHROPIC_TOOLS,
    RESPONSES_TOOLS,
    USER,
    World,
    chat_body,
    delivered_turn,
    make_world,
    restored_run,
)


@pytest.mark.timeout(30)
def test_completions_route_whole_and_streamed(world: World) -> None:
    body = {"model": "reference", "prompt": "Once upon a time", "max_tokens": 12, "seed": 4}
    status, first = world.post(body, path="/v1/completions")
    assert status == 200
    restored_run(world)
    _, again = world.post(body, path="/v1/completions")
    assert again == first
    text = json.loads(first)["choices"][0]["text"]
    world.post({**body, "prompt": "Once upon a time" + text + " and then"}, path="/v1/completions")
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 2 and turns[1].parent_id == turns[0].id and turns[1].branch == 0
    streamed = world.openai().completions.create(
        model="reference", prompt="Far away", max_tokens=8, seed=2, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices)
    assert world.ledger.turns("ep-1")[-1].delivered.endswith(b"data: [DONE]\n\n")


@pytest.mark.timeout(60)
def test_chat_stream_flows_and_is_recorded_before_its_terminal_event(world: World) -> None:
    client = world.openai()
    pieces, usage = [], None
    stream = client.chat.completions.create(
        model="reference", messages=[USER], seed=8, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    turn = delivered_turn(world)
    assert usage is not None and usage.completion_tokens == len(turn.token_ids) == len(turn.logprobs)
    assert len(pieces) > 1, "tokens arrive one by one"
    assert turn.delivered.endswith(b"data: [DONE]\n\n") and turn.delivered_at is not None
    restored_run(world)
    status, replayed = world.post(
        {
            "model": "reference",
            "messages": [USER],
            "seed": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert status == 200 and replayed == turn.delivered


@pytest.mark.timeout(60)
def test_responses_api_whole_and_streamed_with_tool_calls(world: World) -> None:
    client = world.openai()
    calls, seed = [], 0
    while not calls:  # the reference model calls a tool in most, not all, first turns
        seed += 1
        first = client.responses.create(model="reference", input="Make a notes file.", tools=RESPONSES_TOOLS,
                                        instructions="You are terse.", store=False, temperature=1.0, extra_body={"seed": seed})  # fmt: skip
        calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and first.usage is not None and first.usage.output_tokens > 0
    call = calls[0]
    assert call.call_id and json.loads(call.arguments)["command"]
    follow_up = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Make a notes file."}],
        },
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "notes.txt created"},
    ]
    with client.responses.stream(model="reference", input=follow_up, tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
                                 instructions="You are terse.", store=False, temperature=1.0) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output and final.status in ("completed", "incomplete")
    turns = world.ledger.turns("ep-1")
    assert [t.protocol for t in turns] == ["responses"] * len(turns)
    assert turns[-1].parent_id == turns[-2].id, "the follow-up continues the first turn"
    assert turns[-1].delivered.rstrip().splitlines()[0] == b"event: response.created"


@pytest.mark.timeout(60)
def test_anthropic_messages_whole_and_streamed_with_tool_use(world: World) -> None:
    client = world.anthropic()
    message, seed = None, 0
    while message is None or message.stop_reason != "tool_use":
        seed += 1
        message = client.messages.create(model="reference", max_tokens=300, tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
                                          system=[{"type": "text", "text": "You are terse."}], extra_body={"temperature": 1.0},
                                          messages=[{"role": "user", "content": f"Make a notes file ({seed})."}])  # fmt: skip
    use = next(b for b in message.content if b.type == "tool_use")
    assert use.id.startswith("toolu_") and use.input["command"]  # type: ignore[index]
    history: list[Any] = [
        {"role": "user", "content": f"Make a notes file ({seed})."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"},
                                          {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "created"}]},
    ]  # fmt: skip
    with client.messages.stream(model="reference", max_tokens=300, tools=ANTHROPIC_TOOLS, extra_body={"temperature": 1.0},  # type: ignore[arg-type]
                                system=[{"type": "text", "text": "You are terse."}], messages=history) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "tool_use", "max_tokens") and final.content
    turns = world.ledger.turns("ep-1")
    assert turns[-1].parent_id == turns[-2].id, "the tool result continues the tool_use turn"
    assert turns[-1].delivered.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert (
        client.messages.count_tokens(
            model="reference", messages=[{"role": "user", "content": "hi"}]
        ).input_tokens
        > 0
    )
    # The `?beta=true` form Claude Code uses, and an x-api-key header, reach the same route.
    conn = http.client.HTTPConnection("127.0.0.1", world.gateway.port, timeout=30)
    body = {
        "model": "reference",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "u"},
    }
    conn.request("POST", "/v1/messages?beta=true", json.dumps(body), {"x-api-key": "tok-1"})
    assert json.loads(conn.getresponse().read())["type"] == "message"
    conn.close()


@pytest.mark.timeout(60)
def test_a_harness_gone_mid_stream_still_gets_its_turn_recorded_and_replayed(tmp_path: Path) -> None:
    model = ReferenceModelServer(ReferenceModelSettings(seed=3, stream_token_delay_s=0.05)).start()
    world = make_world(tmp_path, model.url, model)
    try:
        body = {"model": "reference", "max_tokens": 200, "messages": [{"role": "user", "content": "a long story"}],
                "stream": True, "temperature": 1.0}  # fmt: skip
        with socket.create_connection(("127.0.0.1", world.gateway.port)) as s:
            data = json.dumps(body).encode()
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: tok-1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
            received = b""
            while b"message_start" not in received:
                received += s.recv(65536)
        # The harness is gone (frozen, then restored elsewhere); the generation runs to its end.
        deadline = time.monotonic() + 30
        while not world.ledger.turns("ep-1") and time.monotonic() < deadline:
            time.sleep(0.1)
        (turn,) = world.ledger.turns("ep-1")
        assert turn.delivered_at is None, "a stream cut before its terminal event is not delivered"
        status, replayed = world.post({**body}, path="/v1/messages")
        assert (
            status == 200
            and replayed == turn.delivered
            and replayed.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        )
        assert delivered_turn(world, 0).delivered_at is not None
    finally:
        world.gateway.stop()
        world.ledger.close()
        model.stop()


class CuttingUpstream:
    """A misbehaving model server (the boundary under test): streams two chunks, then hangs up."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 20)
                chunk = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"},
                         "logprobs": {"content": [{"token": "Hel", "logprob": -0.1}]}, "token_ids": [7]}]}  # fmt: skip
                event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + event + event)

    def stop(self) -> None:
        self.sock.close()


@pytest.mark.timeout(30)
def test_refusals_use_each_protocols_error_shape_and_record_nothing(world: World, tmp_path: Path) -> None:
    anthropic_body = {"model": "reference", "max_tokens": 20, "messages": [USER]}
    status, body = world.post(chat_body(USER), token="wrong")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    status, body = world.post(anthropic_body, token="wrong", path="/v1/messages")
    assert (
        status == 401
        and json.loads(body)["error"]["type"] == "authentication_error"
        and json.loads(body)["type"] == "error"
    )
    assert world.post(chat_body(USER), token="tok-done")[0] == 403
    status, body = world.post(None, raw=b"{not json", path="/v1/messages")
    assert status == 400 and "not JSON" in json.loads(body)["error"]["message"]
    status, body = world.post({"model": "reference", "messages": []})
    assert status == 400 and b"messages" in body
    status, body = world.post(
        {"model": "reference", "input": [{"type": "web_search_call"}]}, path="/v1/responses"
    )
    assert status == 400 and b"input[0].type" in body
    status, body = world.post({"model": "reference", "messages": [USER]}, path="/v1/messages")
    assert status == 400 and b"max_tokens" in body
    status, body = world.post(chat_body(USER), path="/v1/embeddings")
    assert status == 404 and b"/v1/responses" in body
    status, body = world.post({"model": "reference", "messages": [USER], "temperature": -3})
    assert status == 400  # the model server's own error reaches the harness unchanged
    status, body = world.post({**anthropic_body, "temperature": -3}, path="/v1/messages")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"

    deep = json.dumps(chat_body(USER))[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    status, body = world.post(None, raw=deep.encode())
    assert status == 400 and "nests too deep" in json.loads(body)["error"]["message"]
    nested: list[object] = []
    for _ in range(600):  # decodes, but deeper than the canonical form's recursion goes
        nested = [nested]
    status, body = world.post({**anthropic_body, "tools": nested}, path="/v1/messages")
    assert status == 400 and json.loads(body)["type"] == "error"
    image = {"role": "user", "content": [{"type": "image", "source": "abc"}]}
    status, body = world.post({**anthropic_body, "messages": [image]}, path="/v1/messages")
    assert status == 400 and "source: must be an object" in json.loads(body)["error"]["message"]

    small = make_world(tmp_path / "small", world.model.url, world.model, max_body_bytes=1000)
    try:
        status, body = small.post(chat_body({"role": "user", "content": "x" * 2000}))
        assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"
        status, _ = small.post(chat_body({"role": "user", "content": "x" * 2000}), token="nobody")
        assert status == 401, "the key is checked before the body is read"
    finally:
        small.gateway.stop()
        small.ledger.close()
    slow = make_world(tmp_path / "slow", world.model.url, world.model, harness_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", slow.gateway.port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")  # fmt: skip
            assert s.recv(65536).startswith(b"HTTP/1.1 408"), "a body that never arrives holds nothing"
        assert slow.ledger.turns("ep-1") == []
    finally:
        slow.gateway.stop()
        slow.ledger.close()
    cutting = CuttingUpstream()
    cut = make_world(tmp_path / "cut", cutting.url, world.model)
    try:
        status, body = cut.post({**anthropic_body, "stream": True}, path="/v1/messages")
        assert status == 200 and b"event: error" in body and b"message_stop" not in body
        assert cut.ledger.turns("ep-1") == []
    finally:
        cut.gateway.stop()
        cut.ledger.close()
        cutting.stop()
    assert world.ledger.turns("ep-1") == [] and world.ledger.turns("ep-done") == []


@pytest.mark.timeout(30)
def test_a_run_the_model_server_failed_last_is_told_from_one_a_turn_followed(
    world: World, tmp_path: Path
) -> None:
    """The gateway notes each request the model server fails against the episode's run, so the
    control loop can tell an outage that cut a run short from a harness that ended it."""
    with socket.socket() as s:  # a port nothing listens on: the model server is down
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    down = make_world(tmp_path / "down", f"http://127.0.0.1:{closed}/v1", world.model, ledger=world.ledger)
    outages = world.ledger.outages
    try:
        assert outages.cut_short("ep-1", 1) is None, "nothing failed yet"
        status, body = down.post(chat_body(USER))
        assert status == 502 and json.loads(body)["error"]["type"] == "upstream_error"
        outage = outages.cut_short("ep-1", 1)
        assert outage is not None and outage.reruns == 0 and str(closed) in outage.why, outage
        assert outages.cut_short("ep-1", 2) is None, "another run's outage is not this one's"
        assert world.post(chat_body(USER))[0] == 200
        assert outages.cut_short("ep-1", 1) is None, "a turn after the failure: the run went on"
        time.sleep(0.01)
        assert down.post(chat_body(USER, {"role": "user", "content": "again"}))[0] == 502
        assert outages.cut_short("ep-1", 1) is not None, "failed again after its last turn"
        outages.rerun("ep-1", 1)
        outages.failed("ep-1", 2, "model server: 503 overloaded")
        again = outages.cut_short("ep-1", 2)
        assert again is not None and again.reruns == 1 and again.why == "model server: 503 overloaded"
        assert "stasis_gateway_upstream_failures_total 2" in down.gateway.metrics.text().splitlines()
    finally:
        down.gateway.stop()
