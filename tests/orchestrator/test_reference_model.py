"""The reference model: exact log-probs, determinism, grammar-valid tool calls, the OpenAI surface."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from orchestrator.reference_model import (
    POLICY_VERSION_HEADER,
    TOKENIZER_DIR,
    VOCABULARY,
    ReferenceModel,
    ReferenceModelServer,
    ReferenceModelSettings,
    decode,
    tokenize,
    write_tokenizer_dir,
)

REPO = Path(__file__).resolve().parents[2]
SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in /work.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
TOOLS = [SHELL, WRITE_FILE]


def chat_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "reference",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Take notes."},
        ],
        "tools": TOOLS,
        "logprobs": True,
        "top_logprobs": 5,
        "return_token_ids": True,
    }
    body.update(extra)
    return body


def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Mapping[str, str], Any]:
    """POST JSON without any proxy; returns status, headers and the decoded body."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), json.loads(error.read())


def get(url: str) -> tuple[int, Mapping[str, str], Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), json.loads(error.read())


@pytest.fixture(scope="module")
def server() -> Iterator[ReferenceModelServer]:
    with ReferenceModelServer(ReferenceModelSettings(seed=11, policy_version="policy-v1")) as running:
        yield running


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every client in these tests on 127.0.0.1 even if the host sets a proxy."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def choice_of(response: Mapping[str, Any]) -> Mapping[str, Any]:
    return response["choices"][0]


@pytest.mark.timeout(30)
def test_vocabulary_and_tokenizer() -> None:
    assert 300 <= len(VOCABULARY) <= 2000
    assert len(set(VOCABULARY.tokens)) == len(VOCABULARY)
    for text in ["", "echo step 3 >> notes.txt", '{"name": "shell"}', "héllo ✓ 日本\r\n\x00", "<|im_end|>"]:
        ids = tokenize(text)
        assert decode(ids) == text
    # A special spelled in text becomes that token, as in every Hugging Face tokenizer.
    assert tokenize("a<|im_end|>") == [VOCABULARY.id_of("a"), VOCABULARY.id_of("<|im_end|>")]
    assert tokenize('{"name": "') == [VOCABULARY.id_of('{"name": "')]
    assert tokenize("echo") == [VOCABULARY.id_of("echo")]
    # The fewest tokens: " notes" + ".txt" loses to the single token " notes.txt".
    assert tokenize(" notes.txt!") == [VOCABULARY.id_of(" notes.txt"), VOCABULARY.id_of("!")]
    # Characters without a token of their own are their UTF-8 bytes.
    assert [VOCABULARY.tokens[t] for t in tokenize("é")] == ["<0xC3>", "<0xA9>"]


@pytest.mark.timeout(30)
def test_the_shipped_tokenizer_directory_is_what_the_vocabulary_builds(tmp_path: Path) -> None:
    """tokenizer/ holds what `write_tokenizer_dir` makes of the token list, which a stock
    Hugging Face `tokenizers` load reads back as the same tokenizer."""
    write_tokenizer_dir(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (TOKENIZER_DIR / name).read_text() == (tmp_path / name).read_text(), f"regenerate {name}"
    loaded = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    text = "<|im_start|>user\nhello wörld<|im_end|>\n<tool_call>"
    assert loaded.encode(text, add_special_tokens=False).ids == tokenize(text)
    assert loaded.decode(tokenize(text), skip_special_tokens=False) == text
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert "<tool_response>" in (TOKENIZER_DIR / "chat_template.jinja").read_text()


@pytest.mark.timeout(30)
def test_same_request_and_seed_give_identical_output(server: ReferenceModelServer) -> None:
    url = f"{server.url}/chat/completions"
    _, _, first = post(url, chat_body(seed=7))
    _, _, again = post(url, chat_body(seed=7))
    assert choice_of(first)["token_ids"] == choice_of(again)["token_ids"]
    assert choice_of(first)["logprobs"] == choice_of(again)["logprobs"]
    assert choice_of(first)["message"] == choice_of(again)["message"]
    others = [choice_of(post(url, chat_body(seed=s))[2])["token_ids"] for s in range(20, 30)]
    assert any(ids != choice_of(first)["token_ids"] for ids in others)


@pytest.mark.timeout(30)
def test_unseeded_requests_follow_the_server_seed() -> None:
    def run(seed: int) -> list[list[int]]:
        model = ReferenceModel(ReferenceModelSettings(seed=seed))
        return [model.chat_completion(chat_body())["choices"][0]["token_ids"] for _ in range(5)]

    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "sampling",
    [
        {},
        {"temperature": 0.7},
        {"temperature": 1.6, "top_p": 0.9},
        {"tool_choice": "none"},
        {"tool_choice": "required"},
    ],
)
def test_logprobs_are_exactly_the_sampling_distribution(
    server: ReferenceModelServer, sampling: dict[str, Any]
) -> None:
    for seed in range(8):
        body = chat_body(seed=seed, **sampling)
        status, _, response = post(f"{server.url}/chat/completions", body)
        assert status == 200, response
        choice = choice_of(response)
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(choice["token_ids"]) == response["usage"]["completion_tokens"]
        assert response["prompt_token_ids"] == server.model.chat_prompt_ids(body)
        steps = server.model.score_chat(body, choice["token_ids"])
        if "tool_choice" not in sampling:
            # A trainer's teacher-forced pass over prompt and answer gives the very same floats.
            forced = server.model.logprobs(
                response["prompt_token_ids"] + choice["token_ids"],
                temperature=sampling.get("temperature", 1.0),
                top_p=sampling.get("top_p", 1.0),
            )
            assert forced[len(response["prompt_token_ids"]) :] == [e["logprob"] for e in entries]
        for token_id, entry, step in zip(choice["token_ids"], entries, steps, strict=True):
            assert entry["token"] == VOCABULARY.tokens[token_id]
            assert entry["bytes"] == list(VOCABULARY.token_bytes[token_id])
            assert entry["logprob"] == step.logprob(token_id)
            assert [(VOCABULARY.id_of(t["token"]), t["logprob"]) for t in entry["top_logprobs"]] == step.top(
                5
            )
            assert sum(math.exp(t["logprob"]) for t in entry["top_logprobs"]) <= 1 + 1e-12
            assert math.fsum(math.exp(lp) for lp in step.logprobs) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.timeout(60)
def test_sampling_frequencies_match_reported_probabilities() -> None:
    """The tool-vs-answer decision is 50/50 once the tool results reach --mean-tool-turns."""
    model = ReferenceModel(ReferenceModelSettings(seed=5, mean_tool_turns=2, think_probability=0))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(2):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "shell", "arguments": '{"command": "ls"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "notes.txt"})
    body = chat_body(messages=messages, max_tokens=1, top_logprobs=0)
    call_id = VOCABULARY.id_of("<tool_call>")
    [step] = model.score_chat(body, [call_id])
    assert math.exp(step.logprob(call_id)) == pytest.approx(0.5, abs=1e-9)
    trials = 1600
    calls = sum(
        model.chat_completion({**body, "seed": s})["choices"][0]["token_ids"] == [call_id]
        for s in range(trials)
    )
    assert abs(calls / trials - 0.5) < 4 * math.sqrt(0.25 / trials)


@pytest.mark.timeout(60)
def test_tool_calls_are_json_cut_verbatim_from_the_generated_tokens(server: ReferenceModelServer) -> None:
    seen: set[str] = set()
    for seed in range(40):
        body = chat_body(seed=seed, return_tokens_as_token_ids=False)
        _, _, response = post(f"{server.url}/chat/completions", body)
        choice = choice_of(response)
        if choice["finish_reason"] != "tool_calls":
            continue
        generated = "".join(e["token"] for e in choice["logprobs"]["content"])
        assert generated == decode(choice["token_ids"])
        assert choice["message"]["content"] is None
        reasoning = choice["message"].get("reasoning_content")
        expected = [] if reasoning is None else [f"<think>\n{reasoning}\n</think>\n\n"]
        calls = []
        for call in choice["message"]["tool_calls"]:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            seen.add(name)
            parsed = json.loads(arguments)
            assert set(parsed) == ({"command"} if name == "shell" else {"path", "content"})
            assert all(isinstance(v, str) and v for v in parsed.values())
            assert call["type"] == "function" and call["id"].startswith("call_")
            calls.append(f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>')
        assert generated == "".join(expected) + "\n".join(calls) + "<|im_end|>"
    assert seen == {"shell", "write_file"}


@pytest.mark.timeout(60)
def test_episodes_finish_after_a_few_tool_turns() -> None:
    model = ReferenceModel(ReferenceModelSettings(seed=2, mean_tool_turns=4))
    turns = []
    for episode in range(20):
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {episode}"}]
        for turn in range(30):
            message = model.chat_completion({"model": "m", "messages": messages, "tools": TOOLS})["choices"][
                0
            ]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                turns.append(turn)
                assert message["content"]
                break
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "exit code 0\n"})
        else:
            pytest.fail(f"episode {episode} did not finish in 30 turns")
    assert 2.5 <= statistics.mean(turns) <= 6, turns
    assert max(turns) <= 12, turns


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("chat/completions", chat_body(stream="yes"), "stream"),
        ("chat/completions", {"model": "m"}, "messages"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (
            "chat/completions",
            chat_body(messages=[{"role": "user", "content": "a"}, {"role": "bot"}]),
            "messages[1].role",
        ),
        ("chat/completions", chat_body(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (
            "chat/completions",
            chat_body(messages=[{"role": "tool", "content": "x"}]),
            "messages[0].tool_call_id",
        ),
        ("chat/completions", chat_body(temperature=5), "temperature"),
        ("chat/completions", chat_body(n=2), "n"),
        ("chat/completions", chat_body(top_logprobs=21), "top_logprobs"),
        ("chat/completions", chat_body(logprobs=False), "top_logprobs"),
        ("chat/completions", chat_body(max_tokens=0), "max_tokens"),
        ("chat/completions", chat_body(seed="x"), "seed"),
        ("chat/completions", chat_body(stop=[1]), "stop"),
        (
            "chat/completions",
            chat_body(tools=[{"type": "function", "function": {"name": "a b"}}]),
            "tools[0].function.name",
        ),
        (
            "chat/completions",
            chat_body(tool_choice={"type": "function", "function": {"name": "x"}}),
            "tool_choice",
        ),
        ("chat/completions", chat_body(presence_penalty=0.5), "presence_penalty"),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "logprobs": 99}, "logprobs"),
        ("completions", {"model": "m", "prompt": [1, 10**6]}, "prompt"),
        ("completions", {"model": "m", "prompt": [1], "stop_token_ids": "x"}, "stop_token_ids"),
        ("/generate", {"text": "hello"}, "input_ids"),
        ("/generate", {"input_ids": []}, "input_ids"),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"temperature": -1}},
            "sampling_params.temperature",
        ),
        (
            "/generate",
            {"input_ids": [1], "sampling_params": {"frequency_penalty": 1}},
            "sampling_params.frequency_penalty",
        ),
        ("chat/completions", chat_body(chat_template_kwargs={"tools": 1}), "chat_template_kwargs"),
    ],
)
def test_invalid_requests_get_400_naming_the_field(
    server: ReferenceModelServer, path: str, body: dict[str, Any], param: str
) -> None:
    url = server.url.removesuffix("/v1") + path if path.startswith("/") else f"{server.url}/{path}"
    status, headers, response = post(url, body)
    assert status == 400, response
    assert response["error"]["param"] == param
    assert param in response["error"]["message"]
    assert response["error"]["type"] == "invalid_request_error"
    assert headers[POLICY_VERSION_HEADER] == "policy-v1"


@pytest.mark.timeout(30)
def test_malformed_bodies_and_unknown_routes(server: ReferenceModelServer) -> None:
    status, _, response = post(f"{server.url}/chat/completions", None, raw=b"{not json")
    assert status == 400 and "JSON" in response["error"]["message"]
    status, _, response = post(f"{server.url}/chat/completions", [1, 2])
    assert status == 400 and "object" in response["error"]["message"]
    status, _, response = post(f"{server.url}/embeddings", {"model": "m"})
    assert status == 404 and response["error"]["type"] == "not_found_error"


@pytest.mark.timeout(60)
def test_openai_sdk_chat_with_token_ids(server: ReferenceModelServer) -> None:
    from openai import OpenAI

    with OpenAI(base_url=server.url, api_key="x", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "Take notes."}]
        for _ in range(3):
            response = client.chat.completions.create(
                model="reference",
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
                logprobs=True,
                top_logprobs=2,
                extra_body={"return_token_ids": True},
            )
            choice = response.choices[0]
            assert response.system_fingerprint == "policy-v1"
            assert choice.logprobs is not None and choice.logprobs.content is not None
            token_ids = (choice.model_extra or {})["token_ids"]
            assert len(token_ids) == len(choice.logprobs.content) == response.usage.completion_tokens  # type: ignore[union-attr]
            prompt_ids = (response.model_extra or {})["prompt_token_ids"]
            assert prompt_ids == server.model.chat_prompt_ids(
                {"model": "reference", "messages": messages, "tools": TOOLS}
            )
            message = choice.message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                assert json.loads(call.function.arguments)  # type: ignore[union-attr]
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
        raw = client.chat.completions.with_raw_response.create(
            model="reference", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers[POLICY_VERSION_HEADER] == "policy-v1"
        assert raw.parse().choices[0].message.content


@pytest.mark.timeout(60)
def test_streams_carry_each_token_and_join_to_the_whole_answer(server: ReferenceModelServer) -> None:
    from openai import OpenAI

    with OpenAI(base_url=server.url, api_key="x", max_retries=0) as client:
        for seed in range(1, 6):
            body = chat_body(seed=seed, extra_body={"return_token_ids": True})
            del body["return_token_ids"]
            whole = client.chat.completions.create(**body).model_dump()
            options = {"include_usage": True}
            chunks = list(client.chat.completions.create(**body, stream=True, stream_options=options))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reasoning = "".join(
                (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                for c in chunks
                if c.choices
            )
            ids = [
                i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get("token_ids", [])
            ]
            lps = [
                e.logprob
                for c in chunks
                if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or []
            ]
            calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            choice = whole["choices"][0]
            assert ids == choice["token_ids"] and lps == [e["logprob"] for e in choice["logprobs"]["content"]]
            assert text == (choice["message"]["content"] or "")
            assert reasoning == (choice["message"].get("reasoning_content") or "")
            assert [(c.function.name, c.function.arguments) for c in calls] == [
                (t["function"]["name"], t["function"]["arguments"])
                for t in choice["message"].get("tool_calls") or []
            ]
            assert (chunks[0].model_extra or {})["prompt_token_ids"] == whole["prompt_token_ids"]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(ids)
        streamed = client.completions.create(
            model="reference", prompt="Once", max_tokens=10, seed=3, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices)


NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "plan",
        "description": "ask questions",
        "parameters": {
            "type": "object",
            "properties": {
                "questions": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "kind": {"type": "string", "enum": ["yes_no", "free"]},
                            "weight": {"type": "integer"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                        "required": ["id", "kind", "weight"],
                    },
                },
                "session_id": {"type": "number"},
                "mode": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["fast", "slow"]}]},
            },
            "required": ["questions", "session_id", "mode"],
        },
    },
}


@pytest.mark.timeout(60)
def test_tool_calls_are_valid_against_nested_json_schemas(server: ReferenceModelServer) -> None:
    calls = []
    for seed in range(40):
        body = {
            "model": "reference",
            "messages": [{"role": "user", "content": "plan"}],
            "tools": [NESTED_TOOL],
            "seed": seed,
        }
        _, _, data = post(server.url + "/chat/completions", body)
        calls += data["choices"][0]["message"].get("tool_calls") or []
    assert len(calls) >= 5
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        assert isinstance(args["session_id"], int) and args["mode"] in ("fast", "slow")
        assert args["questions"], "minItems is honoured"
        for q in args["questions"]:
            assert (
                isinstance(q["id"], str) and q["kind"] in ("yes_no", "free") and isinstance(q["weight"], int)
            )


@pytest.mark.timeout(60)
def test_openai_sdk_legacy_completion(server: ReferenceModelServer) -> None:
    from openai import OpenAI

    with OpenAI(base_url=server.url, api_key="x", max_retries=0) as client:
        response = client.completions.create(
            model="reference",
            prompt="The result",
            max_tokens=12,
            logprobs=3,
            seed=4,
            extra_body={"return_token_ids": True},
        )
    choice = response.choices[0]
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] == tokenize("The result")
    token_ids = extra["token_ids"]
    assert choice.text == decode(token_ids, skip_special=True)
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == [VOCABULARY.tokens[t] for t in token_ids]
    assert choice.logprobs.text_offset is not None and choice.logprobs.top_logprobs is not None
    for token_id, offset, top in zip(
        token_ids, choice.logprobs.text_offset, choice.logprobs.top_logprobs, strict=True
    ):
        if token_id not in VOCABULARY.special_ids:
            assert choice.text[offset:].startswith(decode([token_id]))
        assert len(top) == 3
    steps = server.model.score_completion({"model": "m", "prompt": "The result"}, token_ids)
    assert choice.logprobs.token_logprobs == [s.logprob(t) for s, t in zip(steps, token_ids, strict=True)]
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.timeout(30)
def test_tokens_as_token_ids(server: ReferenceModelServer) -> None:
    _, _, response = post(
        f"{server.url}/chat/completions", chat_body(seed=1, return_tokens_as_token_ids=True)
    )
    choice = choice_of(response)
    assert [e["token"] for e in choice["logprobs"]["content"]] == [
        f"token_id:{t}" for t in choice["token_ids"]
    ]
    assert all(
        t["token"].startswith("token_id:") for e in choice["logprobs"]["content"] for t in e["top_logprobs"]
    )
    _, _, legacy = post(
        f"{server.url}/completions",
        {"model": "m", "prompt": "a", "logprobs": 1, "return_tokens_as_token_ids": True},
    )
    assert all(t.startswith("token_id:") for t in choice_of(legacy)["logprobs"]["tokens"])


@pytest.mark.timeout(30)
def test_temperature_zero_is_greedy(server: ReferenceModelServer) -> None:
    url = f"{server.url}/chat/completions"
    first = choice_of(post(url, chat_body(temperature=0))[2])
    second = choice_of(post(url, chat_body(temperature=0))[2])
    assert first["token_ids"] == second["token_ids"]
    for entry in first["logprobs"]["content"]:
        assert entry["logprob"] == 0.0
        assert [t["token"] for t in entry["top_logprobs"]] == [entry["token"]]


@pytest.mark.timeout(30)
def test_stop_strings_cut_the_answer(server: ReferenceModelServer) -> None:
    url = f"{server.url}/completions"
    body = {"model": "m", "prompt": "Summary", "max_tokens": 40, "seed": 9, "return_token_ids": True}
    full = choice_of(post(url, body)[2])
    text = full["text"]
    assert len(text) > 6
    stop = text[3:6]
    cut = choice_of(post(url, {**body, "stop": [stop]})[2])
    assert cut["text"] == text[: text.find(stop)]
    assert cut["finish_reason"] == "stop"
    assert cut["token_ids"] == full["token_ids"][: len(cut["token_ids"])]


@pytest.mark.timeout(30)
def test_length_limit(server: ReferenceModelServer) -> None:
    _, _, response = post(
        f"{server.url}/chat/completions", chat_body(seed=1, tool_choice="required", max_tokens=3)
    )
    choice = choice_of(response)
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 3
    # A call cut off mid-way is not a call: its raw text comes back as content.
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == decode(choice["token_ids"])


@pytest.mark.timeout(30)
def test_conversation_history_renders_calls_verbatim(server: ReferenceModelServer) -> None:
    body = chat_body(seed=3, tool_choice="required")
    message = choice_of(post(f"{server.url}/chat/completions", body)[2])["message"]
    call = message["tool_calls"][0]
    follow_up = chat_body(
        seed=3,
        messages=[
            *body["messages"],
            message,
            {"role": "tool", "tool_call_id": call["id"], "content": "done"},
        ],
    )
    status, _, response = post(f"{server.url}/chat/completions", follow_up)
    assert status == 200, response
    prompt = decode(response["prompt_token_ids"])
    assert f'"arguments": {call["function"]["arguments"]}}}\n</tool_call><|im_end|>' in prompt
    assert prompt.endswith(
        "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.timeout(30)
def test_models_health_and_policy_version() -> None:
    with ReferenceModelServer(
        ReferenceModelSettings(seed=1, policy_version="policy-v1", model_name="ref")
    ) as server:
        status, headers, health = get(server.url.removesuffix("/v1") + "/health")
        assert status == 200 and health["policy_version"] == "policy-v1"
        _, _, models = get(f"{server.url}/models")
        assert [m["id"] for m in models["data"]] == ["ref"]
        body = chat_body(seed=5)
        _, _, before = post(f"{server.url}/chat/completions", body)
        server.model.set_policy_version("policy-v2")
        _, headers, after = post(f"{server.url}/chat/completions", body)
        assert headers[POLICY_VERSION_HEADER] == after["system_fingerprint"] == "policy-v2"
        old_ids = choice_of(before)["token_ids"]
        # The recorded turn still scores exactly under the version that sampled it.
        old_steps = server.model.score_chat(body, old_ids, policy_version="policy-v1")
        old_lps = [e["logprob"] for e in choice_of(before)["logprobs"]["content"]]
        assert [s.logprob(t) for s, t in zip(old_steps, old_ids, strict=True)] == old_lps
        new_steps = server.model.score_chat(body, old_ids)
        assert [s.logprob(t) for s, t in zip(new_steps, old_ids, strict=True)] != old_lps


@pytest.mark.timeout(60)
def test_cli_serves_until_sigterm() -> None:
    argv = [sys.executable, "-m", "orchestrator.reference_model", "--port", "0", "--seed", "3"]
    argv += ["--policy-version", "policy-v7", "--mean-tool-turns", "3"]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        prefix = "reference model listening on "
        assert line.startswith(prefix), line
        url = line.removeprefix(prefix)
        status, headers, _ = post(f"{url}/chat/completions", chat_body(seed=1))
        assert status == 200 and headers[POLICY_VERSION_HEADER] == "policy-v7"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.timeout(60)
def test_the_model_is_a_function_of_its_tokens(server: ReferenceModelServer) -> None:
    """A chat request, the same prompt as token ids on /v1/completions, and SGLang's /generate
    sample the same tokens with the same log-probs: tool calls, reasoning and the end of the turn
    are read from the tokens, not from the request's fields."""
    root = server.url.removesuffix("/v1")
    kinds = set()
    for seed in range(12):
        tools = {"tools": TOOLS} if seed % 2 else {"tools": None}
        _, _, chat = post(f"{server.url}/chat/completions", chat_body(seed=seed, top_logprobs=0, **tools))
        prompt, ids = chat["prompt_token_ids"], choice_of(chat)["token_ids"]
        lps = [e["logprob"] for e in choice_of(chat)["logprobs"]["content"]]
        body = {"model": "m", "prompt": prompt, "seed": seed, "max_tokens": 1024, "logprobs": 0}
        _, _, completion = post(f"{server.url}/completions", {**body, "return_token_ids": True})
        assert choice_of(completion)["token_ids"] == ids
        assert choice_of(completion)["logprobs"]["token_logprobs"] == lps
        _, _, generated = post(f"{root}/generate", {"input_ids": prompt, "sampling_params": {"seed": seed, "max_new_tokens": 1024}, "return_logprob": True})  # fmt: skip
        assert generated["output_ids"] == ids
        assert [e[0] for e in generated["meta_info"]["output_token_logprobs"]] == lps
        assert [e[1] for e in generated["meta_info"]["output_token_logprobs"]] == ids
        assert generated["meta_info"]["finish_reason"] == {
            "type": "stop",
            "matched": VOCABULARY.id_of("<|im_end|>"),
        }
        message = choice_of(chat)["message"]
        kinds.add(("calls" if message.get("tool_calls") else "answer", "reasoning_content" in message))
    assert len(kinds) >= 3, kinds
    # Streamed, /generate holds everything so far in each chunk; the last has the finish reason.
    request = urllib.request.Request(
        f"{root}/generate",
        data=json.dumps({"input_ids": prompt, "sampling_params": {"seed": 3}, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        events = [
            json.loads(line[6:]) for line in response.read().split(b"\n\n") if line.startswith(b"data: {")
        ]
    whole = post(
        f"{root}/generate", {"input_ids": prompt, "sampling_params": {"seed": 3}, "return_logprob": True}
    )[2]
    assert events[-1]["output_ids"] == whole["output_ids"]
    assert events[-1]["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)


@pytest.mark.timeout(60)
def test_a_teacher_forced_pass_reproduces_a_whole_conversation() -> None:
    """Turns sampled one after another, each prompt extending the last prompt and answer, score
    exactly under `logprobs` over the final sequence, at every sampled position; context tokens
    score too (the first token has nothing before it)."""
    model = ReferenceModel(ReferenceModelSettings(seed=8))
    body = chat_body(messages=[{"role": "system", "content": "Agent."}, {"role": "user", "content": "Go."}])
    sequence = model.chat_prompt_ids(body)
    sampled: dict[int, float] = {}
    for seed in range(6):
        response = model.completion({"model": "m", "prompt": sequence, "seed": seed, "max_tokens": 400, "logprobs": 0, "return_token_ids": True, "temperature": 0.8})  # fmt: skip
        choice = choice_of(response)
        for k, lp in enumerate(choice["logprobs"]["token_logprobs"]):
            sampled[len(sequence) + k] = lp
        sequence = sequence + choice["token_ids"] + tokenize("\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    scored = model.logprobs(sequence, temperature=0.8)
    assert scored[0] is None and len(scored) == len(sequence)
    assert {i: scored[i] for i in sampled} == sampled
    assert all(isinstance(x, float) for x in scored[1:])
    # Under a later policy version the same tokens score otherwise.
    model.set_policy_version("policy-v2")
    assert {i: model.logprobs(sequence, temperature=0.8)[i] for i in sampled} != sampled
    assert {i: model.logprobs(sequence, "policy-v1", temperature=0.8)[i] for i in sampled} == sampled


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["processed", "raw"])
def test_logprobs_mode_says_which_distribution_is_reported(mode: str) -> None:
    """`processed` reports the distribution a token is drawn from (after temperature and top-p);
    `raw`, like vLLM's default, the one before them, which is not it when a request sets either."""
    model = ReferenceModel(ReferenceModelSettings(seed=4, logprobs_mode=mode))
    for params in ({"temperature": 0.6}, {"top_p": 0.8}, {}):
        response = model.chat_completion(chat_body(seed=2, top_logprobs=0, **params))
        choice = choice_of(response)
        reported = [e["logprob"] for e in choice["logprobs"]["content"]]
        full = response["prompt_token_ids"] + choice["token_ids"]
        sampling = model.logprobs(full, **params)[len(response["prompt_token_ids"]) :]
        plain = model.logprobs(full)[len(response["prompt_token_ids"]) :]
        assert reported == (sampling if mode == "processed" else plain)
        assert (reported == sampling) == (mode == "processed" or not params)


@pytest.mark.timeout(30)
def test_reasoning_shows_in_the_prompt_while_the_tool_cycle_lasts() -> None:
    """The chat template keeps an assistant turn's reasoning after the last user query, and drops
    it from turns before it, as Qwen3's does."""
    model = ReferenceModel(ReferenceModelSettings(seed=1))
    thought = {"role": "assistant", "content": "", "reasoning_content": "look first",
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]}  # fmt: skip
    messages = [
        {"role": "user", "content": "go"},
        thought,
        {"role": "tool", "tool_call_id": "c", "content": "a"},
    ]
    prompt = decode(model.chat_prompt_ids(chat_body(messages=messages)))
    assert "<think>\nlook first\n</think>\n\n<tool_call>" in prompt
    later = decode(
        model.chat_prompt_ids(chat_body(messages=[*messages, {"role": "user", "content": "more"}]))
    )
    assert "look first" not in later
