"""How fast the reference model samples: 50-token chat answers to a 1,500-token prompt, with
top-5 log-probs, beside the same requests' bare HTTP round trip (an unknown route).

    .venv/bin/python benchmarks/reference_model_speed.py [--requests 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request

from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings


def _post(url: str, body: dict[str, object]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except urllib.error.HTTPError as error:
        error.read()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=30)
    n = p.parse_args().requests
    with ReferenceModelServer(ReferenceModelSettings(mean_answer_tokens=10_000)) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi " * 500}], "max_tokens": 50,
                "logprobs": True, "top_logprobs": 5}  # fmt: skip
        sample, bare = [], []
        for seed in range(n):
            started = time.perf_counter()
            _post(f"{server.url}/chat/completions", {**body, "seed": seed})
            sample.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            _post(f"{server.url}/no-such-route", body)
            bare.append((time.perf_counter() - started) * 1000)
    s, b = statistics.median(sample), statistics.median(bare)
    print(
        f"50 tokens: p50 {s:.1f} ms per answer ({s / 50:.2f} ms per token); bare round trip p50 {b:.1f} ms ({s / b:.1f}x)"
    )


if __name__ == "__main__":
    main()
