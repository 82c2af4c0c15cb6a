"""Token-in-token-out at the gateway, against the real reference model: every protocol, whole and
streamed, through the official openai and anthropic SDKs and raw HTTP; a harness that
re-serialises tool calls in its own style; vLLM's and SGLang's token routes. Each episode is held
to the on-policy invariant (`onpolicy.py`): prompts extend the tokens sampled before them, and a
teacher-forced pass reproduces every recorded log-prob exactly."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.reference_model import TOKENIZER_DIR, ReferenceModelServer, ReferenceModelSettings, decode
from orchestrator.trajectory import Ledger, samples
from tests.orchestrator.onpolicy import assert_linear, assert_on_policy
from tests.orchestrator.worlds import (
    ANTHROPIC_TOOLS,
    RESPONSES_TOOLS,
    TOOLS,
    USER,
    World,
    make_world,
    restored_run,
)

TOKENS = {"renderer": "qwen3", "tokenizer": str(TOKENIZER_DIR)}


@pytest.fixture(params=["vllm", "sglang"])
def tokens(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A gateway in token mode over the reference model's vLLM route or its SGLang route."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=7)).start()
    world = make_world(tmp_path, model.url, model, Ledger.sqlite(tmp_path / "ledger.db"), upstream_api=request.param,
                       metrics_listen="127.0.0.1:0", **TOKENS)  # fmt: skip
    yield world
    world.gateway.stop()
    model.stop()


def _turns(world: World) -> list[Any]:
    return world.ledger.turns("ep-1")


def _restyled(arguments: str) -> str:
    return json.dumps(json.loads(arguments), indent=2, sort_keys=True)


@pytest.mark.timeout(60)
def test_chat_streamed_with_arguments_restyled_stays_on_policy(tokens: World) -> None:
    """The openai SDK, streamed, with a harness that sends tool calls back in its own style
    (sorted keys, indentation, `null` content): the model is prompted with what it sampled."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, USER]
    with tokens.openai() as client:
        for _ in range(6):
            stream = client.chat.completions.create(
                model="reference", messages=messages, tools=TOOLS, stream=True
            )  # type: ignore[arg-type]
            content, reasoning, calls = "", "", []
            for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is not None:
                    content += delta.content or ""
                    reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                    calls += delta.tool_calls or []
            restyled = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                         "arguments": _restyled(c.function.arguments)}} for c in calls]  # type: ignore[union-attr]  # fmt: skip
            messages.append(
                {
                    "role": "assistant",
                    "content": content or None,
                    **({"tool_calls": restyled} if restyled else {}),
                }
            )
            if calls:
                messages += [{"role": "tool", "tool_call_id": c.id, "content": "done"} for c in calls]
            else:
                messages.append({"role": "user", "content": "go on"})
    turns = _turns(tokens)
    assert len(turns) == 6 and any(
        t.token_ids[0] == tokens.model.model.vocabulary.id_of("<think>") for t in turns
    )
    assert_linear(turns, assert_on_policy(turns, tokens.model.model))
    # What the harness re-serialised is not what the model sees: its own call text is.
    last = decode(turns[-1].prompt_token_ids)
    assert '"command": "' in last and '\n  "command"' not in last


@pytest.mark.timeout(60)
def test_chat_whole_answers_carry_token_ids_and_logprobs_when_asked(tokens: World) -> None:
    status, raw = tokens.post({"model": "reference", "messages": [USER], "tools": TOOLS, "logprobs": True,
                               "return_token_ids": True})  # fmt: skip
    assert status == 200, raw
    (turn,) = _turns(tokens)
    answer = json.loads(raw)
    choice = answer["choices"][0]
    assert choice["token_ids"] == turn.token_ids and choice["prompt_token_ids"] == turn.prompt_token_ids
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == turn.logprobs
    assert "".join(e["token"] for e in choice["logprobs"]["content"]) == decode(turn.token_ids)
    assert choice["finish_reason"] == ("tool_calls" if choice["message"].get("tool_calls") else "stop")
    restored_run(tokens)
    _, again = tokens.post({"model": "reference", "messages": [USER], "tools": TOOLS, "logprobs": True,
                            "return_token_ids": True})  # fmt: skip
    assert again == raw, "a replay sends the recorded bytes"


@pytest.mark.timeout(60)
def test_responses_streamed_with_reasoning_items_sent_back(tokens: World) -> None:
    """The openai SDK's Responses API, streamed, as Codex speaks it: output items (reasoning
    among them) go back as the next input with the calls' outputs."""
    items: list[Any] = [{"role": "user", "content": "Make a notes file."}]
    reasoned = 0
    with tokens.openai() as client:
        for _ in range(5):
            with client.responses.stream(
                model="reference", input=items, tools=RESPONSES_TOOLS, store=False
            ) as s:  # type: ignore[arg-type]
                response = s.get_final_response()
            output = [o.model_dump(exclude_none=True) for o in response.output]
            reasoned += sum(o["type"] == "reasoning" for o in output)
            items += output
            calls = [o for o in output if o["type"] == "function_call"]
            items += [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls
            ]
            if not calls:
                items.append({"role": "user", "content": "go on"})
    turns = _turns(tokens)
    assert len(turns) == 5 and reasoned == sum(t.token_ids[0] == 7 for t in turns)
    assert_linear(turns, assert_on_policy(turns, tokens.model.model))


@pytest.mark.timeout(60)
def test_anthropic_messages_streamed_with_thinking_blocks(tokens: World) -> None:
    """The anthropic SDK, streamed, with tools: thinking blocks come back signed, and go back."""
    messages: list[dict[str, Any]] = [USER]
    thought = 0
    with tokens.anthropic() as client:
        for _ in range(5):
            with client.messages.stream(
                model="reference", max_tokens=400, tools=ANTHROPIC_TOOLS, messages=messages
            ) as s:  # type: ignore[arg-type]
                message = s.get_final_message()
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            thought += sum(b["type"] == "thinking" and bool(b["signature"]) for b in blocks)
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b["type"] == "tool_use"]
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok"} for b in uses]
            messages.append({"role": "user", "content": results or "go on"})
    turns = _turns(tokens)
    assert len(turns) == 5 and thought == sum(t.token_ids[0] == 7 for t in turns)
    assert_linear(turns, assert_on_policy(turns, tokens.model.model))


@pytest.mark.timeout(60)
def test_completions_continue_the_tokens_sampled(tokens: World) -> None:
    """A legacy completion harness appends text to its prompt: the prompt ids are the last
    turn's prompt and sampled ids, then only the new text's."""
    prompt = "Notes:"
    for n in range(4):
        status, raw = tokens.post({"model": "reference", "prompt": prompt, "max_tokens": 12, "stream": n % 2 == 1},
                                  path="/v1/completions")  # fmt: skip
        assert status == 200, raw
        if n % 2:
            events = [
                json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")
            ]
            text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        else:
            text = json.loads(raw)["choices"][0]["text"]
        prompt += text + f"\n{n}."
    turns = _turns(tokens)
    assert len(turns) == 4 and all(t.kind == "completion" for t in turns)
    assert_linear(turns, assert_on_policy(turns, tokens.model.model))


@pytest.mark.timeout(60)
def test_a_history_the_model_never_sampled_is_a_flagged_break(tokens: World) -> None:
    """An assistant message the model did not write (a harness's own) cannot extend the tokens:
    the conversation is rendered whole, and where that prompt leaves the tokens sampled before
    (here, the template drops reasoning before the last user turn) the turn says so."""
    for seed in range(40):  # an answer that opens with reasoning
        _, raw = tokens.post({"model": "reference", "messages": [USER], "tools": TOOLS, "seed": seed})
        answer = json.loads(raw)["choices"][0]["message"]
        if answer.get("reasoning_content"):
            break
    parent = _turns(tokens)[-1]
    calls = answer.get("tool_calls") or []
    forged = {"role": "assistant", "content": "I wrote this myself."}
    messages = [USER, answer, *[{"role": "tool", "tool_call_id": c["id"], "content": "x"} for c in calls],
                forged, {"role": "user", "content": "go"}]  # fmt: skip
    tokens.post({"model": "reference", "messages": messages, "tools": TOOLS, "seed": seed})
    turn = _turns(tokens)[-1]
    before = parent.prompt_token_ids + parent.token_ids
    assert turn.parent_id == parent.id and turn.prefix_exact is False
    assert turn.lineage.common_prefix < len(before)
    assert turn.prompt_token_ids[: turn.lineage.common_prefix] == before[: turn.lineage.common_prefix]
    assert "assistant message the model did not sample" in turn.lineage.break_reason
    metrics = urllib.request.urlopen(
        f"http://127.0.0.1:{tokens.gateway.metrics_port}/metrics", timeout=10
    ).read()
    assert b'stasis_gateway_prompt_breaks_total{mode="tokens"} 1' in metrics


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["processed", "raw"])
@pytest.mark.parametrize("renderer", [TOKENS, {}], ids=["tokens", "text"])
def test_the_gateway_finds_which_logprobs_the_upstream_reports(
    mode: str, renderer: dict[str, str], tmp_path: Path
) -> None:
    """An upstream reporting raw log-probs (vLLM without --logprobs-mode processed_logprobs) is
    caught: turns sampled at another temperature say their log-probs are not of the sampling
    distribution, and so do their samples and the metrics; at temperature 1 they are."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=7, logprobs_mode=mode)).start()
    world = make_world(
        tmp_path, model.url, model, Ledger.sqlite(tmp_path / "l.db"), metrics_listen="127.0.0.1:0", **renderer
    )
    try:
        for temperature in (0.7, 1.0):
            status, raw = world.post({"model": "reference", "messages": [USER], "temperature": temperature})
            assert status == 200, raw
        hot, plain = _turns(world)
        assert hot.logprobs_mode == plain.logprobs_mode == mode
        assert hot.logprobs_exact == (mode == "processed") and plain.logprobs_exact
        assert [s.logprobs_exact for s in samples(_turns(world))] == [mode == "processed", True]
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{world.gateway.metrics_port}/metrics", timeout=10
        ).read()
        assert (f'logprobs_inexact_total{{mode="{hot.mode}"}} 1'.encode() in metrics) == (mode == "raw")
    finally:
        world.gateway.stop()
        model.stop()


@pytest.mark.timeout(30)
def test_a_bad_renderer_or_tokenizer_is_refused_at_start(tmp_path: Path) -> None:
    from orchestrator.gateway import ChatRenderer, RendererUnavailable

    with pytest.raises(RendererUnavailable, match=r"tokenizer .*tokenizer\.json"):
        ChatRenderer("qwen3", tmp_path)
    with pytest.raises(RendererUnavailable, match="renderer 'no-such-model'"):
        ChatRenderer("no-such-model", TOKENIZER_DIR)
    with pytest.raises(RendererUnavailable, match="enable_thinking"):
        ChatRenderer("qwen3", TOKENIZER_DIR, {"enable_thinking": "maybe"})


@pytest.mark.timeout(60)
def test_a_deferred_tool_loads_into_the_conversation_not_the_tool_listing(tokens: World) -> None:
    """Claude Code defers tools (`defer_loading`) and adds them to its list once a tool search
    loads them: they are not listed up front, and a `tool_reference` in a tool result brings in
    the tool's definition there, so the prompt keeps extending the tokens before it."""
    deferred = {"name": "send", "description": "send a message", "defer_loading": True,
                "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}}}  # fmt: skip
    messages: list[dict[str, Any]] = [USER]
    with tokens.anthropic() as client:
        for turn in range(3):
            tools = [*ANTHROPIC_TOOLS, deferred] if turn else ANTHROPIC_TOOLS
            message = client.messages.create(
                model="reference", max_tokens=300, tools=tools, messages=messages
            )  # type: ignore[arg-type]
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b["type"] == "tool_use"] or [{"id": "none"}]
            loaded = [{"type": "tool_reference", "tool_name": "send"}]
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": loaded}]})  # fmt: skip
    turns = _turns(tokens)
    assert len({t.tools_key for t in turns}) == 1
    assert_linear(turns, assert_on_policy(turns, tokens.model.model))
    assert '"name": "send", "description": "send a message"' in decode(turns[-1].prompt_token_ids)
