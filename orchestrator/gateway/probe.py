"""Which log-probs the upstream reports: of the distribution each token is drawn from
(`processed`: after temperature and top-p), or of the model's before them (`raw`, vLLM's default
unless it runs with `--logprobs-mode processed_logprobs`). With temperature or top-p set, raw
log-probs are not the behaviour policy's, and a trainer's importance ratio built on them is off.

The check asks for one token of the same prompt at temperature 1 and at 0.5, with the top
alternatives' log-probs: a server that reports raw log-probs gives the same numbers for both. It
runs once, on the first turn (again a minute after it could not), and every turn records what it
found (`Turn.logprobs_mode`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from orchestrator.gateway.dialects import Dialect
from orchestrator.gateway.generation import UpstreamFault
from orchestrator.gateway.readers import loads
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.gateway.upstream import Upstream, UpstreamUnreachable
from orchestrator.trajectory.turns import Sampling

log = logging.getLogger(__name__)
RETRY_S = 60.0
TEMPERATURES = (1.0, 0.5)


class LogprobsProbe:
    def __init__(self, upstream: Upstream, dialect: Dialect, renderer: ChatRenderer | None) -> None:
        self.upstream, self.dialect, self.renderer = upstream, dialect, renderer
        self.found = ""
        """processed, raw, or "" (not known yet)."""
        self._tried_at = -RETRY_S
        self._lock = asyncio.Lock()

    async def mode(self, model: str) -> str:
        """What the upstream's log-probs are of, checking (with the model a harness names) if
        not known yet."""
        if self.found or time.monotonic() - self._tried_at < RETRY_S:
            return self.found
        async with self._lock:
            if not self.found and time.monotonic() - self._tried_at >= RETRY_S:
                self._tried_at = time.monotonic()
                try:
                    tops = [await self._top(model, t) for t in TEMPERATURES]
                except (
                    UpstreamUnreachable,
                    UpstreamFault,
                    ValueError,
                    KeyError,
                    TypeError,
                    IndexError,
                ) as exc:
                    log.warning("could not check which log-probs %s reports: %s", self.upstream.base_url, exc)
                    return ""
                if all(tops):
                    self.found = "raw" if tops[0] == tops[1] else "processed"
                    if self.found == "raw":
                        log.warning("%s reports raw log-probs: turns sampled with temperature or top-p will be "
                                    "flagged (vLLM: --logprobs-mode processed_logprobs)", self.upstream.base_url)  # fmt: skip
        return self.found

    async def _top(self, model: str, temperature: float) -> list[float]:
        if self.renderer is not None:
            prompt = self.renderer.render([{"role": "user", "content": "Hello"}], None)
            sampling = Sampling(temperature=temperature, max_tokens=1)
            ids = self.dialect.body(model, prompt, sampling, self.renderer.stop_ids, False, seed=0)
            self.dialect.ask_top_logprobs(ids, 5)
            reply = await self.upstream.post(self.dialect.path, ids, root=self.dialect.root)
            return self.dialect.top_logprobs(loads(reply.body)) if reply.status == 200 else []
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
                                "temperature": temperature, "logprobs": True, "top_logprobs": 5, "seed": 0}  # fmt: skip
        reply = await self.upstream.post("/chat/completions", body)
        if reply.status != 200:
            return []
        content = (loads(reply.body)["choices"][0].get("logprobs") or {}).get("content") or [{}]
        return sorted(float(e["logprob"]) for e in content[0].get("top_logprobs") or [])
