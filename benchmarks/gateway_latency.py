"""Latency the gateway adds per turn (ledger write included), beside direct calls to the same upstream.

    .venv/bin/python benchmarks/gateway_latency.py [--turns 300]

Both paths send the same sequence of chat requests to the reference model in this process; the
gateway path also authenticates, canonicalises, records the turn with fsync, then delivers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from orchestrator.domain import Episode, EpisodeSpec, EpisodeState
from orchestrator.gateway import Gateway, GatewaySettings, Ledger
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings


def _post(url: str, body: bytes, token: str = "") -> bytes:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as resp:
        return resp.read()


def _requests(turns: int) -> list[bytes]:
    messages = [{"role": "user", "content": "benchmark"}]
    out = []
    for i in range(turns):
        # A growing conversation, as an agent's is; each request is new so the gateway samples it.
        messages.append({"role": "user", "content": f"step {i}"})
        out.append(
            json.dumps(
                {"model": "reference", "messages": messages[-40:], "max_tokens": 24, "seed": i}
            ).encode()
        )
    return out


def _percentiles(samples: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(samples, n=100)
    return qs[49], qs[98]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=300)
    turns = p.parse_args().turns
    model = ReferenceModelServer(ReferenceModelSettings(seed=1)).start()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        ledger = Ledger(Path(tmp) / "ledger.db")
        episode = Episode(
            id="ep-bench", spec=EpisodeSpec(image="base", command=("true",)), state=EpisodeState.RUNNING,
            reason="", submitted_at=0, updated_at=0, address="", token="bench", runs=1,
        )  # fmt: skip
        gateway = Gateway(
            GatewaySettings(listen="127.0.0.1:0", upstream=model.url),
            ledger,
            lambda t: episode if t == "bench" else None,
            lambda e: 0.0,
        ).start()
        requests = _requests(turns)
        direct, via = [], []
        for body in requests:  # interleaved, so both paths see the same machine conditions
            started = time.perf_counter()
            _post(model.url + "/chat/completions", body)
            direct.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            _post(f"http://127.0.0.1:{gateway.port}/v1/chat/completions", body, "bench")
            via.append((time.perf_counter() - started) * 1000)
        replay = []
        for body in requests[:100]:
            started = time.perf_counter()
            _post(f"http://127.0.0.1:{gateway.port}/v1/chat/completions", body, "bench")
            replay.append((time.perf_counter() - started) * 1000)
        gateway.stop()
        ledger.close()
    model.stop()
    d50, d99 = _percentiles(direct)
    g50, g99 = _percentiles(via)
    added = [g - d for g, d in zip(via, direct, strict=True)]
    a50, a99 = _percentiles(added)
    r50, r99 = _percentiles(replay)
    print(
        f"{turns} turns: direct p50 {d50:.2f} ms p99 {d99:.2f} ms | via gateway p50 {g50:.2f} ms p99 {g99:.2f} ms"
    )
    print(
        f"added per turn (gateway - direct, paired): p50 {a50:.2f} ms p99 {a99:.2f} ms; ratio p50 {g50 / d50:.2f}x"
    )
    print(f"replayed from the ledger: p50 {r50:.2f} ms p99 {r99:.2f} ms")


if __name__ == "__main__":
    main()
