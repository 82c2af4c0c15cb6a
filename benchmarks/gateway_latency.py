"""What the gateway adds to a model turn, measured beside direct calls to the same upstream.

    .venv/bin/python benchmarks/gateway_latency.py [--turns 300] [--seconds 10] [--harnesses 64]

1. Added latency of a whole chat turn: the same sequence of new chat requests sent to the
   reference model directly and through the gateway, interleaved (the gateway authenticates,
   canonicalises, records the turn with fsync, then delivers).
2. Time to first streamed token: the same streamed requests, directly and through the gateway.
3. Sustained throughput: `--harnesses` concurrent harnesses send new turns for `--seconds`,
   against an upstream that answers at once (a canned completion with token ids and log-probs,
   in its own process), so the figure is the gateway's own; every turn is committed durably.
   Measured in text mode and in token mode (prompts as token ids through the renderer).
4. Long histories, token mode: a harness grows a conversation to 1k, 32k and 128k tokens through
   the gateway (large tool results), then takes `--history-turns` more turns, each adding a small
   tool result. Per turn: the gateway's own time (the round trip less the upstream call it made,
   as the ledger records it), beside the same conversation sent to the model directly, where the
   model server renders and tokenises the whole history itself. In token mode the gateway's cost
   should grow with the new messages, not with the history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from orchestrator.domain import Episode, EpisodeSpec, EpisodeState
from orchestrator.gateway import Gateway, GatewaySettings
from orchestrator.reference_model import TOKENIZER_DIR
from orchestrator.trajectory import Ledger

TOKENS = {"renderer": "qwen3", "tokenizer": str(TOKENIZER_DIR)}
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a shell command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]  # fmt: skip
HISTORIES = (1_000, 32_000, 128_000)


def _post(url: str, body: bytes, token: str = "") -> bytes:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as resp:
        return resp.read()


def _first_token_ms(url: str, body: bytes, token: str = "") -> float:
    """Milliseconds until the first streamed chunk with content arrives."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as resp:
        first = 0.0
        for line in resp:
            if (
                not first
                and line.startswith(b"data: {")
                and b'"content": "' in line
                and b'"content": ""' not in line
            ):
                first = (time.perf_counter() - started) * 1000
        return first


def _requests(turns: int, first_seed: int = 0, **extra: Any) -> list[bytes]:
    messages = [{"role": "user", "content": "benchmark"}]
    out = []
    for i in range(turns):
        # A growing conversation, as an agent's is; each request is new so the gateway samples it.
        messages.append({"role": "user", "content": f"step {i}"})
        body = {"model": "reference", "messages": messages[-40:], "max_tokens": 24, "seed": first_seed + i}
        body.update(extra)
        out.append(json.dumps(body).encode())
    return out


def _sequential(model_url: str, via_url: str, turns: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One harness: whole turns to the model and through the gateway, interleaved so both see the
    same machine; then replays; then streamed turns, timed to their first token."""
    direct, via = [], []
    # The direct calls ask the model for what the gateway asks it for: token ids and log-probs.
    asked = {"logprobs": True, "return_token_ids": True}
    for body, same in zip(_requests(turns), _requests(turns, **asked), strict=True):
        started = time.perf_counter()
        _post(model_url + "/chat/completions", same)
        direct.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        _post(via_url + "/chat/completions", body, "bench")
        via.append((time.perf_counter() - started) * 1000)
    replay = []
    for body in _requests(turns)[:100]:
        started = time.perf_counter()
        _post(via_url + "/chat/completions", body, "bench")
        replay.append((time.perf_counter() - started) * 1000)
    ttft_direct, ttft_via = [], []
    streamed = _requests(100, first_seed=10_000, stream=True)  # new requests, not the ones above
    for body, same in zip(streamed, _requests(100, first_seed=10_000, stream=True, **asked), strict=True):
        ttft_direct.append(_first_token_ms(model_url + "/chat/completions", same))
        ttft_via.append(_first_token_ms(via_url + "/chat/completions", body, "bench"))
    out.put((direct, via, replay, ttft_direct, ttft_via))


def _history(model_url: str, via_url: str, size: int, turns: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One harness growing a conversation to `size` tokens through the gateway, then `turns`
    timed turns each adding a small tool result; and the same conversations sent directly."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "Keep notes."}]  # fmt: skip
    result = "the command printed this line of its output, and then went on " * 60  # ~800 tokens

    tokens = 0

    def turn(content: str) -> float:
        nonlocal tokens
        body = json.dumps(
            {"model": "reference", "messages": messages, "tools": TOOLS, "max_tokens": 64}
        ).encode()
        started = time.perf_counter()
        answer = json.loads(_post(via_url + "/chat/completions", body, "bench"))
        took = (time.perf_counter() - started) * 1000
        tokens = answer["usage"]["total_tokens"]
        message = answer["choices"][0]["message"]
        messages.append(message)
        calls = message.get("tool_calls") or []
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": content} for c in calls)
        if not calls:
            messages.append({"role": "user", "content": content})
        return took

    while tokens < size:
        turn(result)
    grown = tokens
    via = [turn("ok") for _ in range(turns)]
    direct = []
    for _ in range(max(3, turns // 4)):
        body = json.dumps({"model": "reference", "messages": messages, "tools": TOOLS, "max_tokens": 64, "logprobs": True,
                           "return_token_ids": True}).encode()  # fmt: skip
        started = time.perf_counter()
        _post(model_url + "/chat/completions", body)
        direct.append((time.perf_counter() - started) * 1000)
    out.put((grown, via, direct))


def _p(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1]


CANNED = {
    "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": "canned",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 16}, "finish_reason": "stop",
                 "token_ids": list(range(16)),
                 "logprobs": {"content": [{"token": "ok", "logprob": -0.5, "bytes": [111, 107]}] * 16}}],
    "prompt_token_ids": list(range(200)), "usage": {"prompt_tokens": 200, "completion_tokens": 16},
}  # fmt: skip


def _canned_upstream(port: multiprocessing.Value) -> None:  # type: ignore[type-arg]
    """A model server that answers every chat request, and every token-id completion, at once
    with the same completion."""
    from orchestrator.reference_model import tokenize

    body = json.dumps(CANNED).encode()
    ids = [*tokenize("ok " * 8), *tokenize("<|im_end|>")]
    tokens = json.dumps({
        "id": "cmpl-canned", "object": "text_completion", "created": 0, "model": "canned",
        "choices": [{"index": 0, "text": "ok " * 8, "finish_reason": "stop",
                     "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)}}],
    }).encode()  # fmt: skip

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json", headers={"x-policy-version": "v1"})

    async def completion(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=tokens, content_type="application/json", headers={"x-policy-version": "v1"})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/completions", completion)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.value = runner.addresses[0][1]
        await asyncio.Event().wait()

    asyncio.run(main())


def _harnesses(url: str, token: str, harnesses: int, seconds: float, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """`harnesses` concurrent clients, each sending new turns back to back for `seconds`."""

    async def harness(session: aiohttp.ClientSession, n: int, deadline: float) -> int:
        turns = 0
        messages = [{"role": "user", "content": f"harness {n}"}]
        while time.monotonic() < deadline:
            # Each harness is an episode of its own, its conversation growing turn by turn.
            messages = [*messages[-30:], {"role": "user", "content": f"turn {turns}"}]
            body = {"model": "canned", "messages": messages}
            async with session.post(url, json=body, headers={"Authorization": f"Bearer {token}-{n}"}) as r:
                await r.read()
                turns += r.status == 200
        return turns

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=harnesses)
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.monotonic() + seconds
            counts = await asyncio.gather(*(harness(session, n, deadline) for n in range(harnesses)))
        done.put(sum(counts))

    asyncio.run(main())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--harnesses", type=int, default=64)
    p.add_argument("--history-turns", type=int, default=20)
    args = p.parse_args()

    def episode(token: str) -> Episode:
        return Episode(
            id=f"ep-{token}", spec=EpisodeSpec(image="base", command=("true",)), state=EpisodeState.RUNNING,
            reason="", submitted_at=0, updated_at=0, address="", token=token, runs=1,
        )  # fmt: skip

    episodes = {t: episode(t) for t in ["bench", *(f"bench-{n}" for n in range(args.harnesses))]}

    def gateway(tmp: str, upstream: str, **model: str) -> tuple[Gateway, Ledger]:
        ledger = Ledger.sqlite(Path(tmp) / "ledger.db")
        g = Gateway(
            GatewaySettings(listen="127.0.0.1:0", upstream=upstream, **model),
            ledger,
            episodes.get,
            lambda e: 0.0,
            lambda e, peer: True,  # the harnesses here are the live runs
        )
        return g.start(), ledger

    # The model and the harnesses run in processes of their own, as they do in a cluster, so
    # the figures are not the gateway's process sharing one interpreter lock with them.
    model = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.reference_model", "--port", "0", "--seed", "1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert model.stdout is not None
        model_url = model.stdout.readline().split()[-1]
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            gw, ledger = gateway(tmp, model_url)
            results: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
            client = multiprocessing.Process(
                target=_sequential, args=(model_url, f"http://127.0.0.1:{gw.port}/v1", args.turns, results)
            )
            client.start()
            direct, via, replay, ttft_direct, ttft_via = results.get()
            client.join()
            gw.stop()
            ledger.close()
        histories = {}
        for size in HISTORIES:
            with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
                gw, ledger = gateway(tmp, model_url, **TOKENS)
                client = multiprocessing.Process(
                    target=_history,
                    args=(model_url, f"http://127.0.0.1:{gw.port}/v1", size, args.history_turns, results),
                )
                client.start()
                grown, rounds, straight = results.get()
                client.join()
                timed = ledger.turns("ep-bench")[-args.history_turns :]
                own = [r - t.upstream_ms for r, t in zip(rounds, timed, strict=True)]
                histories[size] = (grown, own, [t.upstream_ms for t in timed], straight)
                gw.stop()
                ledger.close()
    finally:
        model.terminate()
        model.wait()

    port = multiprocessing.Value("i", 0)
    upstream = multiprocessing.Process(target=_canned_upstream, args=(port,), daemon=True)
    upstream.start()
    while not port.value:
        time.sleep(0.05)
    canned = f"http://127.0.0.1:{port.value}/v1"
    throughput: dict[str, float] = {}
    recorded = 0
    for mode, model_settings in (("text", {}), ("tokens", TOKENS)):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            gw, ledger = gateway(tmp, canned, **model_settings)
            runs = [("gateway " + mode, f"http://127.0.0.1:{gw.port}/v1/chat/completions")]
            if mode == "text":
                runs.insert(0, ("direct", canned + "/chat/completions"))
            for name, url in runs:
                done: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
                clients = multiprocessing.Process(
                    target=_harnesses, args=(url, "bench", args.harnesses, args.seconds, done)
                )
                clients.start()
                throughput[name] = done.get() / args.seconds
                clients.join()
            recorded += sum(len(ledger.turns(e.id)) for e in episodes.values())
            gw.stop()
            ledger.close()
    upstream.terminate()

    added = [g - d for g, d in zip(via, direct, strict=True)]
    print(f"whole chat turns ({args.turns}): direct p50 {_p(direct, 50):.2f} ms, via gateway p50 {_p(via, 50):.2f} ms "
          f"({_p(via, 50) / _p(direct, 50):.2f}x); added p50 {_p(added, 50):.2f} ms, p99 {_p(added, 99):.2f} ms")  # fmt: skip
    print(f"replayed from the ledger: p50 {_p(replay, 50):.2f} ms, p99 {_p(replay, 99):.2f} ms")
    print(f"first streamed token: direct p50 {_p(ttft_direct, 50):.2f} ms, via gateway p50 {_p(ttft_via, 50):.2f} ms "
          f"(+{_p(ttft_via, 50) - _p(ttft_direct, 50):.2f} ms, {_p(ttft_via, 50) / _p(ttft_direct, 50):.2f}x)")  # fmt: skip
    direct_rate = throughput["direct"]
    print(f"throughput, {args.harnesses} harnesses for {args.seconds:.0f} s: direct {direct_rate:.0f} turns/s, "
          f"via gateway in text mode {throughput['gateway text']:.0f} turns/s ({throughput['gateway text'] / direct_rate:.2f}x), "
          f"in token mode {throughput['gateway tokens']:.0f} turns/s ({throughput['gateway tokens'] / direct_rate:.2f}x), "
          f"{recorded} turns recorded durably")  # fmt: skip
    base = _p(histories[HISTORIES[0]][1], 50)
    for size, (grown, own, upstream_ms, straight) in histories.items():
        print(f"history {size // 1000}k (grown to {grown:,} tokens), token mode, {len(own)} turns: gateway's own time "
              f"p50 {_p(own, 50):.2f} ms ({_p(own, 50) / base:.2f}x the {HISTORIES[0] // 1000}k one), upstream call p50 "
              f"{_p(upstream_ms, 50):.1f} ms; the same conversation sent to the model directly p50 {statistics.median(straight):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
