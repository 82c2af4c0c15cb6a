"""Gateway and ledger against the real reference model, spoken to with raw HTTP and with the
official openai and anthropic SDKs: every protocol whole and streamed, record before deliver,
exactly-once replays, branches and abandonment, and the matching rule's tolerance of noise.
The `world` tests run with the ledger in SQLite and in PostgreSQL (`ledgers.py`)."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import socket
import ssl
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anthropic
import openai
import pytest

from orchestrator.cli.pki import ClusterPki
from orchestrator.domain import Episode, EpisodeSpec, EpisodeState
from orchestrator.gateway import Gateway, GatewaySettings, live_peer
from orchestrator.gateway.protocols.openai import ChatCompletions
from orchestrator.gateway.routes import INLINE_BODY_BYTES
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from orchestrator.trajectory import CanonicalRequest, Ledger, Lineage
from orchestrator.trajectory.samples import samples
from protos.shared.tls import ORCHESTRATOR, TlsFiles, certified_identity
from sandbox_agent.server.forwarder import Forwarder
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener

PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "shell", "description": "run a command", "parameters": PARAMETERS},
    }
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "shell", "description": "run a command", "parameters": PARAMETERS}
]
ANTHROPIC_TOOLS = [{"name": "shell", "description": "run a command", "input_schema": PARAMETERS}]
USER = {"role": "user", "content": "Make a notes file."}


@dataclass
class World:
    gateway: Gateway
    ledger: Ledger
    model: ReferenceModelServer
    episodes: dict[str, Episode]
    resumed_at: dict[str, float] = field(default_factory=dict)
    upstream_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    def post(
        self,
        body: Any,
        token: str = "tok-1",
        path: str = "/v1/chat/completions",
        raw: bytes | None = None,
        source: str = "127.0.0.1",
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.gateway.port, timeout=30, source_address=(source, 0)
        )
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request(
            "POST", path, data, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        )
        response = conn.getresponse()
        out = response.status, response.read()
        conn.close()
        return out

    def set_run(self, episode_id: str, run: int, resumed_at: float) -> None:
        self.episodes[episode_id] = replace(self.episodes[episode_id], runs=run)
        self.resumed_at[episode_id] = resumed_at

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="tok-1", max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base, api_key="tok-1", max_retries=0)


def _episode(episode_id: str, token: str, state: EpisodeState = EpisodeState.RUNNING) -> Episode:
    spec = EpisodeSpec(image="base", command=("true",))
    return Episode(id=episode_id, spec=spec, state=state, reason="", submitted_at=0, updated_at=0,
                   address="10.209.0.2", token=token, runs=1, node="node-1")  # fmt: skip


NODES = {"node-1": "127.0.0.1:7071", "node-2": "127.0.0.2:7071"}
"""Where each node's agent listens: its connections to the gateway come from that host."""


def _world(
    tmp_path: Path,
    upstream: str,
    model: ReferenceModelServer,
    ledger: Ledger | None = None,
    max_staleness: Callable[[Episode], int | None] | None = None,
    family: bool = False,
    **settings: Any,
) -> World:
    ledger = ledger or Ledger.sqlite(tmp_path / "ledger.db")
    episodes = {
        "ep-1": _episode("ep-1", "tok-1"),
        "ep-done": _episode("ep-done", "tok-done", EpisodeState.SUCCEEDED),
    }
    resumed: dict[str, float] = {}
    gateway = Gateway(
        GatewaySettings(listen="127.0.0.1:0", upstream=upstream, **settings),
        ledger,
        lambda token: next((e for e in episodes.values() if e.token == token), None),
        lambda e: resumed.get(e.id, 0.0),
        lambda e, peer: live_peer(e, peer, NODES.get(e.node, "")),
        live_run=lambda db, episode_id: _live_run(episodes[episode_id]),
        max_staleness=max_staleness,
        # As the state store's `keyed_by`: the live fork children holding the episode's key.
        family=(lambda owner: [e for e in episodes.values() if e.key_of == owner and not e.state.terminal])
        if family
        else None,
    ).start()
    return World(gateway, ledger, model, episodes, resumed)


def _live_run(e: Episode) -> tuple[int, str]:
    """As `state.sql.live_run` reads it from the episodes table, here from the test's records."""
    return e.runs, f"episode {e.id} has ended ({e.state})" if e.state.terminal else ""


def _delivered(world: World, index: int = -1) -> Any:
    """The turn once its delivery is noted (that happens just after its last byte went out)."""
    deadline = time.monotonic() + 10
    while (turn := world.ledger.turns("ep-1")[index]).delivered_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return turn


def _count(world: World, delay_s: float = 0.0) -> None:
    """Count (and optionally slow) the reference model's generations: the upstream boundary."""
    model = world.model.model
    for name in ("chat_answer", "completion", "generate"):
        method = getattr(type(model), name)

        def counted(body: Any, method: Any = method) -> Any:
            world.upstream_calls.append(dict(body))
            time.sleep(delay_s)
            return method(model, body)

        setattr(model, name, counted)


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    with opener(request, tmp_path / "ledger.db") as open_:
        yield open_


@pytest.fixture
def world(tmp_path: Path, open_ledger: OpenLedger) -> Iterator[World]:
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    w = _world(tmp_path, model.url, model, open_ledger(), metrics_listen="127.0.0.1:0")
    assert (
        w.gateway.logprobs_mode("reference") == "processed"
    )  # checked once, before the generations are counted
    _count(w)
    yield w
    w.gateway.stop()
    model.stop()


def _chat(*messages: dict[str, Any], seed: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "model": "reference",
        "messages": list(messages),
        "tools": TOOLS,
        "seed": seed,
        "temperature": 1.0,
        **extra,
    }


@pytest.mark.timeout(30)
def test_turn_is_recorded_before_delivery_with_true_logprobs(world: World) -> None:
    status, body = world.post(_chat(USER))
    assert status == 200
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 1 and turns[0].delivered == body and turns[0].response == body
    assert _delivered(world, 0).delivered_at is not None and turns[0].protocol == "chat"
    data = json.loads(body)
    assert turns[0].logprobs == [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
    assert turns[0].token_ids == data["choices"][0]["token_ids"] and turns[0].policy_version == "policy-v1"
    # The recorded log-probs are the ones the sampler drew from, re-derived by scoring.
    scored = world.model.model.score_chat(_chat(USER), turns[0].token_ids)
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
    assert world.post(_chat(USER))[0] == 200
    assert world.post(_chat(long))[0] == 200
    assert not threads[0].startswith("gateway-state") and threads[1].startswith("gateway-state")
    # What the pool refuses is refused as on the loop.
    deep = json.dumps(_chat(long))[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    status, body = world.post(None, raw=deep.encode())
    assert status == 400 and "nests too deep" in json.loads(body)["error"]["message"]
    status, body = world.post(None, raw=json.dumps([_chat(long)]).encode())
    assert status == 400 and "must be a JSON object" in json.loads(body)["error"]["message"]
    assert len(world.ledger.turns("ep-1")) == 2


def _restored(world: World) -> None:
    """The episode's next run, from a snapshot that froze the sandbox once every turn so far had
    been delivered."""
    frozen = max(t.delivered_at or 0.0 for t in world.ledger.turns("ep-1")) + 0.001
    world.set_run("ep-1", run=world.episodes["ep-1"].runs + 1, resumed_at=frozen)


@pytest.mark.timeout(30)
def test_a_request_asked_again_is_sampled_afresh_in_its_run_and_replayed_to_a_restored_harness(
    world: World,
) -> None:
    """The same run asking again what it was answered is not a retry: a new sample, a sibling of
    its own. A restored harness asking its requests again gets each recorded answer, byte for
    byte and in order, and a third time is sampled afresh again."""
    _, first = world.post(_chat(USER))
    _, second = world.post(_chat(USER))
    one, two = _delivered(world, 0), _delivered(world, 1)
    assert len(world.ledger.turns("ep-1")) == 2 and (one.delivered, two.delivered) == (first, second)
    assert (one.parent_id, two.parent_id, one.branch, two.branch) == (None, None, 0, 1)
    assert (one.replays, two.replays, one.abandoned, two.abandoned) == (0, 0, False, False)
    _restored(world)
    assert [world.post(_chat(USER))[1] for _ in range(2)] == [first, second]
    assert len(world.ledger.turns("ep-1")) == 2
    world.post(_chat(USER))
    assert [(t.replays, t.run, t.delivered_run) for t in world.ledger.turns("ep-1")] == [
        (1, 1, 2),
        (1, 1, 2),
        (0, 2, 2),
    ]


@pytest.mark.timeout(30)
def test_a_retry_of_an_answer_the_harness_never_received_is_replayed(world: World) -> None:
    """A harness that hung up before its answer arrived asks again in the same run: the recorded
    turn is replayed, not sampled again. Once it has had the answer, asking again is a new sample."""
    _count(world, delay_s=0.5)
    _hung_up(world, _chat(USER), wait_s=0.1)
    wait_until(lambda: world.ledger.turns("ep-1"), 10, "the turn to be recorded")
    _, retried = world.post(_chat(USER))  # waits for the failed delivery's lock, then replays
    turn = _delivered(world, 0)
    assert len(world.ledger.turns("ep-1")) == 1 and retried == turn.delivered and turn.replays == 1
    world.post(_chat(USER))
    assert [t.replays for t in world.ledger.turns("ep-1")] == [1, 0]


@pytest.mark.timeout(30)
def test_serialisation_noise_does_not_fork_but_what_the_model_sees_does(world: World) -> None:
    _, first = world.post(_chat(USER))
    message = json.loads(first)["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    tool_result = {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "x", "content": "done"}
    _, second = world.post(_chat(USER, message, tool_result))
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
    body = _chat(user, noisy, {**tool_result, "content": "done\n"})
    body["seed"] = 1.0
    _restored(world)  # a restored harness sends what it was answered again, re-serialised
    _, replayed = world.post(body)
    assert replayed == second
    assert len(world.upstream_calls) == 2
    # A different call id, an image part or another sampling parameter is another request.
    if calls:
        renamed = json.loads(json.dumps(message))
        renamed["tool_calls"][0]["id"] = "call-renamed"
        world.post(_chat(USER, renamed, {**tool_result, "tool_call_id": "call-renamed"}))
        assert len(world.upstream_calls) == 3
    world.post(_chat(USER, message, tool_result, top_p=0.5))
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
        _, raw = world.post(_chat(*messages))
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
    _count(world, delay_s=0.3)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(world.post(_chat(USER))[1])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    turns = world.ledger.turns("ep-1")
    assert sorted(results) == sorted(t.delivered for t in turns) and len(turns) == 4
    assert sorted(t.branch for t in turns) == [0, 1, 2, 3] and not any(t.replays for t in turns)


@pytest.mark.timeout(60)
def test_a_turn_without_a_version_header_records_the_version_published_when_its_sampling_began(
    tmp_path: Path, open_ledger: OpenLedger, caplog: pytest.LogCaptureFixture
) -> None:
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    # The reference model names its version in x-policy-version: a header it never sends stands
    # in for a model server that names none.
    world = _world(tmp_path, model.url, model, open_ledger(), policy_version_header="x-not-sent",
                   metrics_listen="127.0.0.1:0")  # fmt: skip
    try:
        policy, metrics = world.ledger.policy, world.gateway.metrics
        with caplog.at_level("WARNING", logger="orchestrator.gateway.recording"):
            assert world.post(_chat(USER, seed=1))[0] == 200
            assert world.post(_chat(USER, seed=2, stream=True))[0] == 200
        first, second = world.ledger.turns("ep-1")
        assert first.policy_version == second.policy_version == "", "neither named nor published"
        assert metrics.value("policy_version_unknown") == 2
        warned = [r for r in caplog.records if "no policy version" in r.getMessage()]
        assert len(warned) == 1 and "ep-1" in warned[0].getMessage(), "warned once per episode"
        scraped = urllib.request.urlopen(
            f"http://127.0.0.1:{world.gateway.metrics_port}/metrics", timeout=10
        ).read()
        assert b"stasis_gateway_policy_version_unknown_total 2" in scraped

        policy.publish(7)
        answer = type(world.model.model).chat_answer

        def published_meanwhile(body: Any) -> Any:
            """A trainer publishes its next version while the generation runs."""
            policy.publish(policy.published() + 1)
            return answer(world.model.model, body)

        world.model.model.chat_answer = published_meanwhile  # type: ignore[method-assign]
        assert world.post(_chat(USER, seed=3))[0] == 200
        assert world.post(_chat(USER, seed=4, stream=True))[0] == 200
        whole, streamed = world.ledger.turns("ep-1")[2:]
        assert (whole.policy_version, streamed.policy_version) == ("7", "8"), "not the one published after"
        assert policy.published() == 9
        assert metrics.value("policy_version_unknown") == 2
        sample = samples([whole], policy.published())[0]
        assert {s for s, known in zip(sample.staleness, sample.staleness_known, strict=True) if known} == {2}
    finally:
        world.gateway.stop()
        model.stop()


@pytest.mark.timeout(60)
def test_a_members_turn_past_its_groups_max_staleness_is_held_back_unsampled_and_unrecorded(
    tmp_path: Path, open_ledger: OpenLedger
) -> None:
    """ep-1 is member 0 of a group with max_staleness 1; its turns record the published version."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    world = _world(tmp_path, model.url, model, open_ledger(), policy_version_header="x-not-sent",
                   max_staleness=lambda e: 1 if e.group_id == "g-1" else None)  # fmt: skip
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], group_id="g-1", group_index=0)
    anthropic_body = {"model": "reference", "max_tokens": 20, "messages": [USER]}
    try:
        _count(world)
        policy = world.ledger.policy
        assert world.post(_chat(USER, seed=1))[0] == 200, "nothing published: nothing is stale"
        policy.publish(1)
        assert world.post(_chat(USER, seed=2))[0] == 200
        policy.publish(2)
        assert world.post(_chat(USER, seed=3))[0] == 200, "its oldest ordered tokens lag 1: within the bound"
        assert [t.policy_version for t in world.ledger.turns("ep-1")] == ["", "1", "2"]
        calls = len(world.upstream_calls)

        policy.publish(3)  # version 1's tokens would now lag 2
        status, body = world.post(_chat(USER, seed=4))
        error = json.loads(body)["error"]
        assert status == 503 and error["type"] == "overloaded_error"
        for words in ("group g-1, member 0", "stale-bounded", "2 policy versions behind the published version 3",
                      "max_staleness 1", "held back unsampled and nothing is recorded"):  # fmt: skip
            assert words in error["message"], error["message"]
        status, body = world.post(anthropic_body, path="/v1/messages")
        assert status == 503 and json.loads(body)["error"]["type"] == "overloaded_error"
        status, _ = world.post(_chat(USER, seed=5, stream=True))
        assert status == 503, "a stream is refused before its headers"
        assert len(world.ledger.turns("ep-1")) == 3 and len(world.upstream_calls) == calls, "never sampled"
        assert world.gateway.metrics.value("stale_held") == 3

        # What the control loop does: the member's turns are abandoned and it runs from the start.
        assert world.ledger.start_over("ep-1") == 3
        world.set_run("ep-1", 2, 0.0)
        status, body = world.post(_chat(USER, seed=1))
        assert status == 200 and len(world.upstream_calls) == calls + 1, "sampled afresh, not replayed"
        fresh = world.ledger.turns("ep-1")[-1]
        assert (fresh.policy_version, fresh.branch, fresh.edge, fresh.abandoned) == ("3", 0, "root", False)
        assert all(t.abandoned and t.branch > 0 for t in world.ledger.turns("ep-1")[:3])

        # The same lag in no group, or in a group with no bound, is not held back.
        policy.publish(9)
        for group in ("", "g-unbounded"):
            world.episodes["ep-1"] = replace(world.episodes["ep-1"], group_id=group)
            assert world.post(_chat(USER, seed=6 + len(group)))[0] == 200
    finally:
        world.gateway.stop()
        model.stop()


@pytest.mark.timeout(30)
def test_branches_parallel_calls_and_abandonment(world: World) -> None:
    _, r1 = world.post(_chat(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    ctx = [USER, a1, result]
    world.post(_chat(*ctx))  # turn 2 on the main branch, run 1
    # A parallel call in the same run from the same point: its own branch, nothing abandoned.
    world.post(_chat(*ctx[:2], {**result, "content": "other result"}))
    turns = world.ledger.turns("ep-1")
    assert [(t.branch, t.abandoned) for t in turns] == [(0, False), (0, False), (1, False)]

    # Run 2 resumes from a snapshot that froze the sandbox after turn 1 was delivered: the
    # harness replays turn 1, then its tool output differs, so it diverges where run 1 went on.
    world.set_run("ep-1", run=2, resumed_at=_delivered(world, 0).delivered_at)
    _, again = world.post(_chat(USER))
    assert again == r1
    world.post(_chat(*ctx[:2], {**result, "content": "a different result"}))
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
    _, r1 = world.post(_chat(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    world.post(_chat(USER, a1, result))  # delivered before the freeze
    delivered_before_freeze = _delivered(world).delivered_at + 0.001
    world.post(_chat(USER, a1, {**result, "content": "replayed after restore"}))  # delivered after it
    world.set_run("ep-1", run=2, resumed_at=delivered_before_freeze)
    world.post(_chat(USER, a1, {**result, "content": "replayed after restore"}))  # a replay: run 2 has it
    world.post(_chat(USER, a1, {**result, "content": "a subagent after restore"}))  # a new sibling
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
    _, r1 = world.post(_chat(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    froze = _delivered(world, 0).delivered_at + 0.001
    world.upstream_calls.clear()
    _count(world, delay_s=1.0)
    run_1 = threading.Thread(target=lambda: world.post(_chat(USER, a1, result)))
    run_1.start()
    wait_until(lambda: world.upstream_calls, 10, "run 1's generation to begin")
    world.set_run("ep-1", run=2, resumed_at=froze)  # its node is lost; run 2 restored from before it
    _hung_up(world, _chat(USER, a1, result), wait_s=0.3)  # waits on run 1's generation, then resets
    run_1.join()
    assert _delivered(world, 1).delivered_at is not None, "run 1's harness had it, after the freeze"
    time.sleep(0.5)  # the reset harness's replay is attempted meanwhile
    world.post(_chat(USER, a1, {**result, "content": "a different result"}))
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
    _, r1 = world.post(_chat(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "1", "content": "ok"}
    status, _ = world.post(_chat(USER, a1, result, stream=stream))
    froze = time.time()
    assert status == 200
    first, had = other.turns("ep-1")
    parallel = {**result, "content": "a parallel call's result"}
    request = CanonicalRequest.parse("chat", _chat(USER, a1, parallel))
    other.record("ep-1", 2, froze, request, b"", {"role": "assistant", "content": "p"}, b"", "chat", b"",
                 [1], [-0.5], [], "policy-v1", 1.0, lineage=Lineage(first.id, None))  # fmt: skip
    assert not any(t.abandoned for t in other.turns("ep-1")), "the harness had the turn when it froze"
    assert _delivered(world, 1).delivered_at is not None and had.id == world.ledger.turns("ep-1")[1].id


@pytest.mark.timeout(30)
def test_completions_route_whole_and_streamed(world: World) -> None:
    body = {"model": "reference", "prompt": "Once upon a time", "max_tokens": 12, "seed": 4}
    status, first = world.post(body, path="/v1/completions")
    assert status == 200
    _restored(world)
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
    turn = _delivered(world)
    assert usage is not None and usage.completion_tokens == len(turn.token_ids) == len(turn.logprobs)
    assert len(pieces) > 1, "tokens arrive one by one"
    assert turn.delivered.endswith(b"data: [DONE]\n\n") and turn.delivered_at is not None
    _restored(world)
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
    world = _world(tmp_path, model.url, model)
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
        assert _delivered(world, 0).delivered_at is not None
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
    status, body = world.post(_chat(USER), token="wrong")
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    status, body = world.post(anthropic_body, token="wrong", path="/v1/messages")
    assert (
        status == 401
        and json.loads(body)["error"]["type"] == "authentication_error"
        and json.loads(body)["type"] == "error"
    )
    assert world.post(_chat(USER), token="tok-done")[0] == 403
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
    status, body = world.post(_chat(USER), path="/v1/embeddings")
    assert status == 404 and b"/v1/responses" in body
    status, body = world.post({"model": "reference", "messages": [USER], "temperature": -3})
    assert status == 400  # the model server's own error reaches the harness unchanged
    status, body = world.post({**anthropic_body, "temperature": -3}, path="/v1/messages")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"

    deep = json.dumps(_chat(USER))[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
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

    small = _world(tmp_path / "small", world.model.url, world.model, max_body_bytes=1000)
    try:
        status, body = small.post(_chat({"role": "user", "content": "x" * 2000}))
        assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"
        status, _ = small.post(_chat({"role": "user", "content": "x" * 2000}), token="nobody")
        assert status == 401, "the key is checked before the body is read"
    finally:
        small.gateway.stop()
        small.ledger.close()
    slow = _world(tmp_path / "slow", world.model.url, world.model, harness_timeout_s=0.5)
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
    cut = _world(tmp_path / "cut", cutting.url, world.model)
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
    down = _world(tmp_path / "down", f"http://127.0.0.1:{closed}/v1", world.model, ledger=world.ledger)
    outages = world.ledger.outages
    try:
        assert outages.cut_short("ep-1", 1) is None, "nothing failed yet"
        status, body = down.post(_chat(USER))
        assert status == 502 and json.loads(body)["error"]["type"] == "upstream_error"
        outage = outages.cut_short("ep-1", 1)
        assert outage is not None and outage.reruns == 0 and str(closed) in outage.why, outage
        assert outages.cut_short("ep-1", 2) is None, "another run's outage is not this one's"
        assert world.post(_chat(USER))[0] == 200
        assert outages.cut_short("ep-1", 1) is None, "a turn after the failure: the run went on"
        time.sleep(0.01)
        assert down.post(_chat(USER, {"role": "user", "content": "again"}))[0] == 502
        assert outages.cut_short("ep-1", 1) is not None, "failed again after its last turn"
        outages.rerun("ep-1", 1)
        outages.failed("ep-1", 2, "model server: 503 overloaded")
        again = outages.cut_short("ep-1", 2)
        assert again is not None and again.reruns == 1 and again.why == "model server: 503 overloaded"
        assert "stasis_gateway_upstream_failures_total 2" in down.gateway.metrics.text().splitlines()
    finally:
        down.gateway.stop()


@pytest.mark.timeout(30)
def test_only_the_live_run_is_heard_and_a_stale_sandbox_gets_409(world: World) -> None:
    assert world.post(_chat(USER))[0] == 200, "from node-1, where the episode runs"
    # The episode moved to node-2 (its first node was declared lost): node-1's sandbox is stale.
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], node="node-2", runs=2)
    status, body = world.post(_chat(USER, seed=2))
    assert status == 409 and b"is not its live run" in body and b"conflict_error" in body, body
    assert len(world.ledger.turns("ep-1")) == 1 and len(world.upstream_calls) == 1, "nothing recorded"
    assert world.post(_chat(USER, seed=2), source="127.0.0.2")[0] == 200, "from node-2's relay"
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], state=EpisodeState.PREEMPTED)
    status, body = world.post(_chat(USER, seed=3), source="127.0.0.2")
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
    _count(world, delay_s=1.0)
    replies: list[tuple[int, bytes]] = []
    asking = threading.Thread(target=lambda: replies.append(world.post({**_chat(USER), "stream": stream})))
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
    bounded = _world(
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
        assert bounded.post(_chat(USER), token="nobody", source="127.0.0.3")[0] == 401, "another peer gets in"
        settled()
        hold("127.0.0.3")
        hold("127.0.0.4")
        assert "holds 5 connections" in refusal("127.0.0.5")
        first.close()
        closed += 1
        settled()
        assert bounded.post(_chat(USER))[0] == 200, "a closed connection frees its place"
        assert len(bounded.ledger.turns("ep-1")) == 1, "nothing refused was recorded"
    finally:
        for sock in held:
            sock.close()
        bounded.gateway.stop()
        bounded.ledger.close()


# -- the nodes' TLS port ------------------------------------------------------------------------


@pytest.fixture
def tls_world(tmp_path: Path) -> Iterator[tuple[World, ClusterPki]]:
    """A gateway that nodes relay to, as `stasis server` with the cluster's TLS serves it."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    pki = ClusterPki(tmp_path / "pki")
    w = _world(tmp_path, model.url, model, tls=pki.orchestrator())
    assert w.gateway.logprobs_mode("reference") == "processed"
    _count(w)
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
    assert _relayed(world, None, _chat(USER)) is None, "plaintext"
    assert _relayed(world, _no_certificate(pki), _chat(USER)) is None, "TLS without a certificate"
    forged = TlsFiles(pki.ca_cert, foreign.cert, foreign.key).client_context()
    assert _relayed(world, forged, _chat(USER)) is None, "a certificate from a foreign CA"
    named_no_node = _relayed(world, pki.orchestrator().client_context(), _chat(USER))
    assert named_no_node is not None and named_no_node[0] == 409, "a certificate naming no node"
    assert world.ledger.turns("ep-1") == [] and world.upstream_calls == [], "nothing recorded"
    assert _relayed(world, pki.node("node-1").client_context(), _chat(USER)) == (200, ANY), "node-1's relay"
    assert len(world.ledger.turns("ep-1")) == 1


@pytest.mark.timeout(60)
def test_a_nodes_certificate_relays_only_for_the_episodes_placed_on_it(
    tls_world: tuple[World, ClusterPki],
) -> None:
    """Over TLS the certificate, not the address, says which node relays: node-2's certificate
    from node-1's address gets 409, and node-1's from anywhere is heard."""
    world, pki = tls_world
    node_1, node_2 = pki.node("node-1").client_context(), pki.node("node-2").client_context()
    refused = _relayed(world, node_2, _chat(USER), source="127.0.0.1")
    assert refused is not None and refused[0] == 409, refused
    assert b"node node-2 at 127.0.0.1" in refused[1] and b"nothing is recorded" in refused[1], refused
    assert world.ledger.turns("ep-1") == [] and world.upstream_calls == [], "nothing recorded"
    assert _relayed(world, node_1, _chat(USER), source="127.0.0.2") == (200, ANY), (
        "node-1, from node-2's address"
    )
    world.episodes["ep-1"] = replace(world.episodes["ep-1"], node="node-2", runs=2)
    moved = _relayed(world, node_1, _chat(USER, seed=2))
    assert moved is not None and moved[0] == 409, "the episode moved: node-1's stale sandbox"
    assert len(world.ledger.turns("ep-1")) == 1 and len(world.upstream_calls) == 1
    assert _relayed(world, node_2, _chat(USER, seed=2)) == (200, ANY), "node-2, where it runs now"


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
        conn.request("POST", "/v1/chat/completions", json.dumps(_chat(USER)).encode(),
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
            conn.request("POST", "/v1/chat/completions", json.dumps(_chat(USER)).encode(),
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
        assert _through(relay, _chat(USER))[0] == 200
        for src, dst in ((renewed.key, mine.key), (renewed.cert, mine.cert)):
            dst.with_suffix(".new").write_bytes(src.read_bytes())
            dst.with_suffix(".new").replace(dst)
        status, answer = _through(relay, _chat(USER, seed=2))
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
