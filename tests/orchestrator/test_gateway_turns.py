"""A harness's turns through the gateway (`gateway/turn.py`, `recording.py`,
`delivery.py`): recorded before delivered, exactly-once replays, the matching rule's tolerance of
noise, branches and abandonment.

Against the real reference model, spoken to with raw HTTP and with the official openai and
anthropic SDKs (`worlds.World`); the `world` tests run with the ledger in SQLite and in
PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time
import urllib.request
from typing import Any

import pytest

from orchestrator.gateway.protocols.openai import ChatCompletions
from orchestrator.gateway.routes import INLINE_BODY_BYTES
from orchestrator.trajectory import CanonicalRequest, Lineage
from orchestrator.trajectory.samples import samples
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.ledgers import OpenLedger
from tests.orchestrator.worlds import USER, World, chat_body, count_generations, delivered_turn, restored_run


@pytest.mark.timeout(30)
def test_turn_is_recorded_before_delivery_with_true_logprobs(world: World) -> None:
    status, body = world.post(chat_body(USER))
    assert status == 200
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 1 and turns[0].delivered == body and turns[0].response == body
    assert delivered_turn(world, 0).delivered_at is not None and turns[0].protocol == "chat"
    data = json.loads(body)
    assert turns[0].logprobs == [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
    assert turns[0].token_ids == data["choices"][0]["token_ids"] and turns[0].policy_version == "policy-v1"
    # The recorded log-probs are the ones the sampler drew from, re-derived by scoring.
    scored = world.model.model.score_chat(chat_body(USER), turns[0].token_ids)
    assert [d.logprob(t) for d, t in zip(scored, turns[0].token_ids, strict=True)] == turns[0].logprobs


@pytest.mark.timeout(30)
def test_a_long_conversation_is_parsed_off_the_event_loop(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A harness's request of megabytes is decoded and parsed on the gateway's pool, so that the
    event loop, which serves every sandbox's streams, does not stall on it; a short one, which
    takes well under a millisecond, stays on the loop."""
    parse, threads = ChatCompletions.parse, []

    def recorded(self: ChatCompletions, body: dict[str, Any]) -> Any:
        threads.append(threading.current_thread().name)
        return parse(self, body)

    monkeypatch.setattr(ChatCompletions, "parse", recorded)
    long = {"role": "user", "content": "Make a notes file. " * (INLINE_BODY_BYTES // 16)}
    assert world.post(chat_body(USER))[0] == 200
    assert world.post(chat_body(long))[0] == 200
    assert not threads[0].startswith("gateway-state") and threads[1].startswith("gateway-state")
    # What the pool refuses is refused as on the loop.
    deep = json.dumps(chat_body(long))[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    status, body = world.post(None, raw=deep.encode())
    assert status == 400 and "nests too deep" in json.loads(body)["error"]["message"]
    status, body = world.post(None, raw=json.dumps([chat_body(long)]).encode())
    assert status == 400 and "must be a JSON object" in json.loads(body)["error"]["message"]
    assert len(world.ledger.turns("ep-1")) == 2


@pytest.mark.timeout(30)
def test_a_request_asked_again_is_sampled_afresh_in_its_run_and_replayed_to_a_restored_harness(
    world: World,
) -> None:
    """The same run asking again what it was answered is not a retry: a new sample, a sibling of
    its own. A restored harness asking its requests again gets each recorded answer, byte for
    byte and in order, and a third time is sampled afresh again."""
    _, first = world.post(chat_body(USER))
    _, second = world.post(chat_body(USER))
    one, two = delivered_turn(world, 0), delivered_turn(world, 1)
    assert len(world.ledger.turns("ep-1")) == 2 and (one.delivered, two.delivered) == (first, second)
    assert (one.parent_id, two.parent_id, one.branch, two.branch) == (None, None, 0, 1)
    assert (one.replays, two.replays, one.abandoned, two.abandoned) == (0, 0, False, False)
    restored_run(world)
    assert [world.post(chat_body(USER))[1] for _ in range(2)] == [first, second]
    assert len(world.ledger.turns("ep-1")) == 2
    world.post(chat_body(USER))
    assert [(t.replays, t.run, t.delivered_run) for t in world.ledger.turns("ep-1")] == [
        (1, 1, 2),
        (1, 1, 2),
        (0, 2, 2),
    ]


@pytest.mark.timeout(30)
def test_a_retry_of_an_answer_the_harness_never_received_is_replayed(world: World) -> None:
    """A harness that hung up before its answer arrived asks again in the same run: the recorded
    turn is replayed, not sampled again. Once it has had the answer, asking again is a new sample."""
    count_generations(world, delay_s=0.5)
    _hung_up(world, chat_body(USER), wait_s=0.1)
    wait_until(lambda: world.ledger.turns("ep-1"), 10, "the turn to be recorded")
    _, retried = world.post(chat_body(USER))  # waits for the failed delivery's lock, then replays
    turn = delivered_turn(world, 0)
    assert len(world.ledger.turns("ep-1")) == 1 and retried == turn.delivered and turn.replays == 1
    world.post(chat_body(USER))
    assert [t.replays for t in world.ledger.turns("ep-1")] == [1, 0]


@pytest.mark.timeout(30)
def test_serialisation_noise_does_not_fork_but_what_the_model_sees_does(world: World) -> None:
    _, first = world.post(chat_body(USER))
    message = json.loads(first)["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    tool_result = {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "x", "content": "done"}
    _, second = world.post(chat_body(USER, message, tool_result))
    # The same conversation, re-serialised: argument JSON re-spaced with keys reordered, CRLF and
    # padding in text, None for empty content, text split into parts, 1.0 for 1.
    noisy = json.loads(json.dumps(message))
    noisy["content"] = None if not message.get("content") else f"  {message['content']}\r\n"
    for call in noisy.get("tool_calls") or []:
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=2)
    user = {
        "role": "user",
        "content": [{"type": "text", "text": "Make a "}, {"type": "text", "text": "notes file."}],
    }
    body = chat_body(user, noisy, {**tool_result, "content": "done\n"})
    body["seed"] = 1.0
    restored_run(world)  # a restored harness sends what it was answered again, re-serialised
    _, replayed = world.post(body)
    assert replayed == second
    assert len(world.upstream_calls) == 2
    # A different call id, an image part or another sampling parameter is another request.
    if calls:
        renamed = json.loads(json.dumps(message))
        renamed["tool_calls"][0]["id"] = "call-renamed"
        world.post(chat_body(USER, renamed, {**tool_result, "tool_call_id": "call-renamed"}))
        assert len(world.upstream_calls) == 3
    world.post(chat_body(USER, message, tool_result, top_p=0.5))
    assert len(world.upstream_calls) == 3 + bool(calls)


def _restyled(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as a harness that re-serialises tool calls in its own style sends it
    back: sorted keys, indented arguments, `null` content."""
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=2, sort_keys=True)}}
        for c in message.get("tool_calls") or []
    ]  # fmt: skip
    return {
        "role": "assistant",
        "content": message.get("content") or None,
        **({"tool_calls": calls} if calls else {}),
    }


@pytest.mark.timeout(60)
def test_text_mode_detects_drift_and_no_sample_appends_a_prompt(world: World) -> None:
    """In text mode the model server renders the harness's re-serialised history as text, so its
    prompt leaves the tokens the model sampled: every such turn is flagged where it breaks, counted
    in the metrics, and starts a sample of its own instead of being appended whole."""
    messages: list[dict[str, Any]] = [USER]
    for _ in range(5):
        _, raw = world.post(chat_body(*messages))
        message = json.loads(raw)["choices"][0]["message"]
        messages.append(_restyled(message))
        calls = message.get("tool_calls") or []
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "done"} for c in calls]
        if not calls:
            messages.append({"role": "user", "content": "go on"})
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 5 and all(
        t.mode == "text" and t.parent_id == p.id for p, t in itertools.pairwise(turns)
    )
    assert turns[0].prefix_exact is True and turns[0].parent_id is None
    breaks = [t for t in turns if t.prefix_exact is False]
    assert breaks, "re-serialised arguments re-tokenise otherwise"
    by_id = {t.id: t for t in turns}
    for t in breaks:
        parent = by_id[t.parent_id]
        before = parent.prompt_token_ids + parent.token_ids
        assert t.lineage.common_prefix < len(before)
        assert t.prompt_token_ids[: t.lineage.common_prefix] == before[: t.lineage.common_prefix]
        assert "rendered the conversation anew" in t.lineage.break_reason
    got = samples(turns)
    assert len(got) == 1 + len(breaks)
    for sample in got:
        last = by_id[sample.turn_ids[-1]]
        assert len(sample.token_ids) == len(last.prompt_token_ids) + len(last.token_ids)
    assert sum(sum(s.loss_mask) for s in got) == sum(len(t.token_ids) for t in turns)
    metrics = urllib.request.urlopen(
        f"http://127.0.0.1:{world.gateway.metrics_port}/metrics", timeout=10
    ).read()
    assert f'stasis_gateway_prompt_breaks_total{{mode="text"}} {len(breaks)}'.encode() in metrics
    assert b'stasis_gateway_turns_total{mode="text"} 5' in metrics


@pytest.mark.timeout(30)
def test_concurrent_identical_requests_each_get_a_sample_of_their_own(world: World) -> None:
    """Identical requests of harnesses that stay to hear their answers (two subagents given the
    same prompt) are not retries: each waits for the one before, then is sampled itself."""
    count_generations(world, delay_s=0.3)
    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(world.post(chat_body(USER))[1])) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    turns = world.ledger.turns("ep-1")
    assert sorted(results) == sorted(t.delivered for t in turns) and len(turns) == 4
    assert sorted(t.branch for t in turns) == [0, 1, 2, 3] and not any(t.replays for t in turns)


@pytest.mark.timeout(30)
def test_branches_parallel_calls_and_abandonment(world: World) -> None:
    _, r1 = world.post(chat_body(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    ctx = [USER, a1, result]
    world.post(chat_body(*ctx))  # turn 2 on the main branch, run 1
    # A parallel call in the same run from the same point: its own branch, nothing abandoned.
    world.post(chat_body(*ctx[:2], {**result, "content": "other result"}))
    turns = world.ledger.turns("ep-1")
    assert [(t.branch, t.abandoned) for t in turns] == [(0, False), (0, False), (1, False)]

    # Run 2 resumes from a snapshot that froze the sandbox after turn 1 was delivered: the
    # harness replays turn 1, then its tool output differs, so it diverges where run 1 went on.
    world.set_run("ep-1", run=2, resumed_at=delivered_turn(world, 0).delivered_at)
    _, again = world.post(chat_body(USER))
    assert again == r1
    world.post(chat_body(*ctx[:2], {**result, "content": "a different result"}))
    turns = world.ledger.turns("ep-1")
    main = [t for t in turns if t.branch == 0]
    assert [t.run for t in main] == [1, 2] and not any(t.abandoned for t in main)
    assert [t.abandoned for t in turns if t.run == 1][1:] == [True, True]
    (b0, *others) = world.ledger.branches("ep-1")
    assert b0.id == 0 and len(b0.turns) == 2
    assert all(b.abandoned for b in others)
    # Every sampled token of the live turns is trained in one sample; abandoned turns in none.
    main_samples = samples(world.ledger.turns("ep-1"))
    assert {i for s in main_samples for i in s.turn_ids} == {t.id for t in b0.turns}
    assert sum(sum(s.loss_mask) for s in main_samples) == sum(len(t.token_ids) for t in b0.turns)


@pytest.mark.timeout(30)
def test_a_turn_the_restored_harness_had_is_never_abandoned_by_a_later_sibling(world: World) -> None:
    _, r1 = world.post(chat_body(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    world.post(chat_body(USER, a1, result))  # delivered before the freeze
    delivered_before_freeze = delivered_turn(world).delivered_at + 0.001
    world.post(chat_body(USER, a1, {**result, "content": "replayed after restore"}))  # delivered after it
    world.set_run("ep-1", run=2, resumed_at=delivered_before_freeze)
    world.post(chat_body(USER, a1, {**result, "content": "replayed after restore"}))  # a replay: run 2 has it
    world.post(chat_body(USER, a1, {**result, "content": "a subagent after restore"}))  # a new sibling
    assert [t.abandoned for t in world.ledger.turns("ep-1")] == [False] * 4


def _hung_up(world: World, body: dict[str, Any], wait_s: float) -> None:
    """A harness that sends `body`, waits `wait_s`, and resets its connection unanswered."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", world.gateway.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
        time.sleep(wait_s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.timeout(30)
def test_a_replay_the_harness_never_received_is_not_delivered_to_its_run(world: World) -> None:
    """Run 2's harness asks again for a turn run 1 was still generating, and hangs up before the
    replay reaches it: the turn is not noted as delivered to run 2, so when the harness goes
    another way from the same parent, the turn it never had is abandoned and its own continues
    the main branch."""
    _, r1 = world.post(chat_body(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    froze = delivered_turn(world, 0).delivered_at + 0.001
    world.upstream_calls.clear()
    count_generations(world, delay_s=1.0)
    run_1 = threading.Thread(target=lambda: world.post(chat_body(USER, a1, result)))
    run_1.start()
    wait_until(lambda: world.upstream_calls, 10, "run 1's generation to begin")
    world.set_run("ep-1", run=2, resumed_at=froze)  # its node is lost; run 2 restored from before it
    _hung_up(world, chat_body(USER, a1, result), wait_s=0.3)  # waits on run 1's generation, then resets
    run_1.join()
    assert delivered_turn(world, 1).delivered_at is not None, "run 1's harness had it, after the freeze"
    time.sleep(0.5)  # the reset harness's replay is attempted meanwhile
    world.post(chat_body(USER, a1, {**result, "content": "a different result"}))
    first, unsent, diverged = world.ledger.turns("ep-1")
    assert unsent.abandoned and not diverged.abandoned, "the harness never had it"
    first, unsent, diverged = world.ledger.turns("ep-1")
    assert (unsent.replays, unsent.delivered_run, unsent.sending_run) == (0, 1, 0), "never delivered to run 2"
    assert [t.id for t in world.ledger.branches("ep-1")[0].turns] == [first.id, diverged.id], "main is whole"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream", [False, True])
def test_a_delivered_turn_never_reads_as_undelivered(
    world: World, open_ledger: OpenLedger, stream: bool
) -> None:
    """The moment a harness has a turn, the ledger already holds that it may: another
    orchestrator on the database (one that takes over after a crash) restores the sandbox from a
    snapshot that froze it right then, and the harness's parallel call does not abandon it."""
    other = open_ledger()
    _, r1 = world.post(chat_body(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    status, _ = world.post(chat_body(USER, a1, result, stream=stream))
    froze = time.time()
    assert status == 200
    first, had = other.turns("ep-1")
    parallel = {**result, "content": "a parallel call's result"}
    request = CanonicalRequest.parse("chat", chat_body(USER, a1, parallel))
    other.record("ep-1", 2, froze, request, b"", {"role": "assistant", "content": "p"}, b"", "chat", b"",
                 [1], [-0.5], [], "policy-v1", 1.0, lineage=Lineage(first.id, None))  # fmt: skip
    assert not any(t.abandoned for t in other.turns("ep-1")), "the harness had the turn when it froze"
    assert delivered_turn(world, 1).delivered_at is not None and had.id == world.ledger.turns("ep-1")[1].id
