"""Answering a harness's request: from the ledger if it repeats a recorded turn, else sampled.

The replay check and the claim on a new sample are one step, under the request's lock: an
identical request waits for the first, then gets its recorded answer if its run was never
answered with it (a retry), else a sample of its own. A sample is asked for with per-token
log-probs and token ids; in token mode its prompt is the conversation rendered to ids through the
model's template. It then waits for a generation slot (`slots`), and a group member's turn that
would go past its group's `max_staleness` is held back unsampled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web

from orchestrator.domain import Episode
from orchestrator.gateway.commit import KeyLocks, StatePool
from orchestrator.gateway.delivery import Delivery
from orchestrator.gateway.dialects import Dialect
from orchestrator.gateway.metrics import Metrics
from orchestrator.gateway.probe import LogprobsProbe
from orchestrator.gateway.prompts import Prompt, chat_prompt, completion_prompt
from orchestrator.gateway.protocols import GatewayError, Request, sampling_of
from orchestrator.gateway.relay import Relay
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.gateway.slots import FairSlots, SlotTimeout
from orchestrator.gateway.turn import Turn
from orchestrator.trajectory import policy
from orchestrator.trajectory.ledger import Ledger
from orchestrator.trajectory.turns import Sampling
from orchestrator.trajectory.turns import Turn as RecordedTurn

TOKEN_PARAMETERS = ("seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
"""Sampling parameters a harness may set that go upstream beside the prompt ids as they are."""


class Answers:
    """Answers each harness request with a replay or a fresh sample."""

    def __init__(
        self,
        settings: GatewaySettings,
        ledger: Ledger,
        pool: StatePool,
        metrics: Metrics,
        probe: LogprobsProbe,
        dialect: Dialect,
        renderer: ChatRenderer | None,
        relay: Relay,
        delivery: Delivery,
        max_staleness: Callable[[Episode], int | None],
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.pool = pool
        self.metrics = metrics
        self.probe = probe
        self.dialect = dialect
        self.renderer = renderer
        self.relay = relay
        self.delivery = delivery
        self.max_staleness = max_staleness
        """The bound of the episode's GRPO group (`Group.max_staleness`); None for no bound or no
        group. A turn that would take a member past it is held back (`_within_bound`)."""
        self.slots = FairSlots(settings.max_concurrent_turns, settings.max_turns_per_episode)
        self._locks = KeyLocks()

    async def answer(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        req = turn.request
        async with self._locks.hold((turn.episode.id, req.canonical.fingerprint)):
            # Under this request's lock, so no identical request can be sampled meanwhile.
            # A turn this run was never answered with is replayed (a retry, or a restored harness
            # asking again); one it was answered with is not retried, and the request is sampled
            # afresh beside it, as a model server would.
            recorded = self.ledger.find(turn.episode.id, req.canonical, turn.episode.runs)
            if recorded is not None:
                self.metrics.count("replays")
                return await self.delivery.recorded(
                    request, recorded.id, recorded.delivered, req.stream, turn.episode.runs, replay=True
                )
            turn = await self._prepared(turn)
            try:
                async with self.slots.hold(turn.episode.id, self.settings.turn_wait_s):
                    # Read as sampling begins: a version published while it runs is not its own.
                    turn = dataclasses.replace(
                        turn, published=await self.pool.call(self.ledger.policy.published)
                    )
                    await self._within_bound(turn)
                    if req.stream:
                        return await self.relay.stream(request, turn)
                    return await self.relay.whole(request, turn)
            except SlotTimeout as exc:
                held = self.slots.held(turn.episode.id)
                raise GatewayError(429, f"{exc}: this episode holds {held} of them; retry shortly",
                                   "rate_limit_error") from None  # fmt: skip

    async def _prepared(self, turn: Turn) -> Turn:
        """The turn with what it is sampled from: the recorded turn it continues, the body sent
        upstream and, in token mode, its prompt as token ids."""
        req = turn.request
        parent = self.ledger.parent(turn.episode.id, req.canonical)
        body = self._upstream_body(req)
        turn = dataclasses.replace(
            turn,
            parent=parent,
            body=body,
            sampling=sampling_of(body),
            logprobs_mode=await self.probe.mode(str(req.upstream.get("model", ""))),
        )
        if self.renderer is None:
            return turn
        # Rendering a long conversation is CPU work: on the pool, off the event loop.
        prompt = await self.pool.call(self._prompt, parent, req)
        sampling = turn.sampling
        if not sampling.max_tokens:  # a token route has no chat route's default
            sampling = dataclasses.replace(sampling, max_tokens=self.settings.max_tokens)
        body = self._token_body(req, prompt, sampling)
        return dataclasses.replace(turn, prompt=prompt, sampling=sampling, body=body)

    async def _within_bound(self, turn: Turn) -> None:
        """Refuse, unsampled and unrecorded, a group member's turn that would be sampled under the
        published version while its trajectory holds tokens more than its group's `max_staleness`
        versions older: 503, which harnesses retry, so the member is held until the control loop
        runs it again from the start (`Control`, `policy.beyond_bound`)."""
        e = turn.episode
        if not e.group_id:
            return
        bound = await self.pool.call(self.max_staleness, e)
        if bound is None:
            return
        lag = policy.beyond_bound(
            await self.pool.call(self.ledger.live_versions, e.id), turn.published, bound
        )
        if lag is None:
            return
        self.metrics.count("stale_held")
        why = policy.stale_member(lag, turn.published, bound)
        raise GatewayError(
            503, f"episode {e.id} (group {e.group_id}, member {e.group_index}) is {why}; this turn is held back "
            "unsampled and nothing is recorded: the member runs again from the start under the published version",
            "overloaded_error",
        )  # fmt: skip

    def _upstream_body(self, req: Request) -> dict[str, Any]:
        body = dict(req.upstream)
        # Explicit settings, so the record says what the tokens were drawn with: a server's own
        # defaults (a model's generation config) are not known here.
        body.setdefault("temperature", self.settings.temperature)
        body.setdefault("top_p", self.settings.top_p)
        body["return_token_ids"] = True
        if req.upstream_path == "/chat/completions":
            body["logprobs"] = True
        elif not isinstance(body.get("logprobs"), int) or body["logprobs"] < 1:
            body["logprobs"] = 1
        if req.stream:
            body["stream"] = True
        return body

    def _prompt(self, parent: RecordedTurn | None, req: Request) -> Prompt:
        assert self.renderer is not None
        if req.canonical.kind == "completion":
            return completion_prompt(self.renderer, parent, req)
        return chat_prompt(self.renderer, parent, req)

    def _token_body(self, req: Request, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        assert self.renderer is not None
        up = req.upstream
        extra = {k: up[k] for k in TOKEN_PARAMETERS if up.get(k) is not None}
        return self.dialect.body(str(up.get("model", "")), prompt.ids, sampling, self.renderer.stop_ids, req.stream,
                                 **extra)  # fmt: skip
