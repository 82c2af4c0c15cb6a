"""Gateway and ledger against the real reference model: record before deliver, exactly-once
replays, branches and abandonment, and the matching rule's tolerance of re-templating noise."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain import Episode, EpisodeSpec, EpisodeState
from orchestrator.gateway import Gateway, Ledger, Upstream
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@dataclass
class World:
    gateway: Gateway
    ledger: Ledger
    model: ReferenceModelServer
    episodes: dict[str, Episode]
    resumed_after: dict[str, int] = field(default_factory=dict)
    upstream_calls: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}/v1"

    def post(
        self, body: dict[str, Any], token: str = "tok-1", path: str = "/chat/completions"
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def set_run(self, episode_id: str, run: int, resumed_after: int) -> None:
        self.episodes[episode_id] = replace(self.episodes[episode_id], runs=run)
        self.resumed_after[episode_id] = resumed_after


class CountingUpstream(Upstream):
    calls: list[bytes]
    delay_s: float = 0.0

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.calls.append(body)
        time.sleep(self.delay_s)
        return super().post(path, body)


def _episode(episode_id: str, token: str, state: EpisodeState = EpisodeState.RUNNING) -> Episode:
    spec = EpisodeSpec(image="base", command=("true",))
    return Episode(
        id=episode_id,
        spec=spec,
        state=state,
        reason="",
        submitted_at=0,
        updated_at=0,
        address="",
        token=token,
        runs=1,
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    ledger = Ledger(tmp_path / "ledger.db")
    episodes = {
        "ep-1": _episode("ep-1", "tok-1"),
        "ep-done": _episode("ep-done", "tok-done", EpisodeState.SUCCEEDED),
    }
    resumed: dict[str, int] = {}
    upstream = CountingUpstream(model.url)
    object.__setattr__(upstream, "calls", [])
    gateway = Gateway(
        "127.0.0.1:0",
        ledger,
        lambda token: next((e for e in episodes.values() if e.token == token), None),
        lambda e: resumed.get(e.id, 0),
        upstream,
    ).start()
    w = World(gateway, ledger, model, episodes, resumed, upstream.calls)
    yield w
    gateway.stop()
    ledger.close()
    model.stop()


def _chat(*messages: dict[str, Any], seed: int = 1) -> dict[str, Any]:
    return {
        "model": "reference",
        "messages": list(messages),
        "tools": TOOLS,
        "seed": seed,
        "temperature": 1.0,
    }


USER = {"role": "user", "content": "Make a notes file."}


@pytest.mark.timeout(30)
def test_turn_is_recorded_before_delivery_with_true_logprobs(world: World) -> None:
    status, body = world.post(_chat(USER))
    assert status == 200
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 1 and turns[0].response == body
    data = json.loads(body)
    assert turns[0].logprobs == [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]]
    assert turns[0].token_ids == data["choices"][0]["token_ids"] and turns[0].policy_version == "policy-v1"
    # The recorded log-probs are the ones the sampler drew from, re-derived by scoring.
    scored = world.model.model.score_chat(_chat(USER), turns[0].token_ids)
    assert [d.logprob(t) for d, t in zip(scored, turns[0].token_ids, strict=True)] == turns[0].logprobs


@pytest.mark.timeout(30)
def test_repeated_request_is_replayed_byte_for_byte(world: World) -> None:
    _, first = world.post(_chat(USER))
    _, again = world.post(_chat(USER))
    assert again == first
    assert len(world.upstream_calls) == 1
    (turn,) = world.ledger.turns("ep-1")
    assert turn.replays == 1


@pytest.mark.timeout(30)
def test_retemplating_noise_does_not_fork(world: World) -> None:
    _, first = world.post(_chat(USER))
    message = json.loads(first)["choices"][0]["message"]
    tool_result = {"role": "tool", "tool_call_id": "x", "content": "done"}
    _, second = world.post(_chat(USER, message, tool_result))
    # The same conversation, re-serialised: other call ids, argument JSON re-spaced with keys
    # reordered, CRLF and padding in text, None for empty content.
    noisy = json.loads(json.dumps(message))
    noisy["content"] = None if not message.get("content") else f"  {message['content']}\r\n"
    for call in noisy.get("tool_calls") or []:
        call["id"] = "call-renamed"
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=2)
    user = {"role": "user", "content": [{"type": "text", "text": "Make a notes file."}]}
    _, replayed = world.post(
        _chat(user, noisy, {**tool_result, "tool_call_id": "other", "content": "done\n"})
    )
    assert replayed == second
    assert len(world.upstream_calls) == 2


@pytest.mark.timeout(30)
def test_concurrent_identical_requests_sample_once(world: World) -> None:
    upstream = world.gateway.upstream
    object.__setattr__(upstream, "delay_s", 0.5)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(world.post(_chat(USER))[1])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(world.upstream_calls) == 1
    assert len(world.ledger.turns("ep-1")) == 1


@pytest.mark.timeout(30)
def test_branches_parallel_calls_and_abandonment(world: World) -> None:
    _, r1 = world.post(_chat(USER))
    a1 = json.loads(r1)["choices"][0]["message"]
    ctx = [USER, a1, {"role": "tool", "tool_call_id": "1", "content": "ok"}]
    _, _ = world.post(_chat(*ctx))  # turn 2 on the main branch, run 1
    # A parallel call in the same run from the same point: its own branch, nothing abandoned.
    world.post(_chat(*ctx[:2], {"role": "tool", "tool_call_id": "1", "content": "other result"}))
    turns = world.ledger.turns("ep-1")
    assert [(t.branch, t.abandoned) for t in turns] == [(0, False), (0, False), (1, False)]

    # Run 2 resumes from a snapshot taken after turn 1: the harness rolls back, replays turn 1,
    # then its tool output differs, so it diverges where run 1 went on.
    world.set_run("ep-1", run=2, resumed_after=turns[0].id)
    _, again = world.post(_chat(USER))
    assert again == r1
    world.post(_chat(*ctx[:2], {"role": "tool", "tool_call_id": "1", "content": "a different result"}))
    turns = world.ledger.turns("ep-1")
    main = [t for t in turns if t.branch == 0]
    assert [t.run for t in main] == [1, 2] and not any(t.abandoned for t in main)
    assert [t.abandoned for t in turns if t.run == 1][1:] == [True, True]
    (b0, *others) = world.ledger.branches("ep-1")
    assert b0.id == 0 and len(b0.turns) == 2 and sum(b0.loss_mask) == sum(len(t.token_ids) for t in b0.turns)
    assert len(b0.token_ids) == len(b0.logprobs) == len(b0.loss_mask)
    assert all(b.abandoned for b in others)


@pytest.mark.timeout(30)
def test_completions_route(world: World) -> None:
    body = {"model": "reference", "prompt": "Once upon a time", "max_tokens": 12, "seed": 4}
    status, first = world.post(body, path="/completions")
    assert status == 200
    _, again = world.post(body, path="/completions")
    assert again == first
    text = json.loads(first)["choices"][0]["text"]
    world.post({**body, "prompt": "Once upon a time" + text + " and then"}, path="/completions")
    turns = world.ledger.turns("ep-1")
    assert len(turns) == 2 and turns[1].parent_id == turns[0].id and turns[1].branch == 0


@pytest.mark.timeout(30)
def test_refusals(world: World) -> None:
    assert world.post(_chat(USER), token="wrong")[0] == 401
    assert world.post(_chat(USER), token="tok-done")[0] == 403
    status, body = world.post({**_chat(USER), "stream": True})
    assert status == 400 and b"stream" in body
    status, body = world.post({"model": "reference", "messages": []})
    assert status == 400 and b"messages" in body
    status, body = world.post({"model": "reference", "messages": [USER], "temperature": -3})
    assert status == 400  # the model server's own error reaches the harness unchanged
    assert world.ledger.turns("ep-1") == [] and world.ledger.turns("ep-done") == []
