"""The inference gateway: the harness's only model endpoint and the ledger's only writer.

Each request is authenticated by its episode's key before its body is read, answered from the
ledger if it repeats a recorded turn, and otherwise sampled upstream with per-token log-probs and
token ids asked for. A whole response is committed to the ledger before its first byte goes to
the harness; a streamed one flows as it is generated and is committed before its terminal event.
A generation always runs to its end and is recorded, even when the harness has gone away (frozen
mid-stream), so its retry is served from the ledger. The replay check and the claim on a new
sample are one step: an identical request waits for the first, then gets its recorded answer if
its run was never answered with it (a retry), else a sample of its own.

Served on aiohttp in an event loop of its own; ledger and state calls run on a small thread pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from orchestrator.domain import Conflict, Episode, EpisodeState
from orchestrator.gateway.dialects import DIALECTS
from orchestrator.gateway.door import Door
from orchestrator.gateway.generation import Generation, UpstreamFault
from orchestrator.gateway.metrics import Metrics
from orchestrator.gateway.probe import LogprobsProbe
from orchestrator.gateway.prompts import Prompt, chat_prompt, completion_prompt
from orchestrator.gateway.protocols import GatewayError, Protocol, Request, sampling_of
from orchestrator.gateway.protocols.anthropic import Messages
from orchestrator.gateway.protocols.anthropic import to_messages as anthropic_messages
from orchestrator.gateway.protocols.anthropic import to_tools as anthropic_tools
from orchestrator.gateway.protocols.openai import ChatCompletions, Completions
from orchestrator.gateway.protocols.responses import Responses
from orchestrator.gateway.readers import TextReader, TokenReader, loads
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.gateway.slots import FairSlots, SlotTimeout
from orchestrator.gateway.upstream import Stream, Upstream, UpstreamUnreachable
from orchestrator.state.sql import Connection
from orchestrator.trajectory import edges, policy
from orchestrator.trajectory.ledger import Ledger, Sampling, extension
from orchestrator.trajectory.ledger import Turn as RecordedTurn
from protos.shared.address import host_of, split_host_port
from protos.shared.tls import certified_identity, node_of

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOLS: dict[str, Protocol] = {
    "/v1/chat/completions": ChatCompletions(),
    "/v1/completions": Completions(),
    "/v1/responses": Responses(),
    "/v1/messages": Messages(),
}
TOKEN_PARAMETERS = ("seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
"""Sampling parameters a harness may set that go upstream beside the prompt ids as they are."""
INLINE_BODY_BYTES = 64 << 10
"""Request bodies up to this size are decoded on the event loop (it takes well under a
millisecond); longer ones on the gateway's pool (`Gateway._body`)."""
_OPENAI = PROTOCOLS["/v1/chat/completions"]
_ANTHROPIC = PROTOCOLS["/v1/messages"]
_EVENT_STREAM = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class _Turn:
    """One harness request on its way to becoming a recorded turn."""

    episode: Episode
    resumed_at: float
    protocol: Protocol
    request: Request
    raw: bytes
    parent: RecordedTurn | None = None
    """The recorded turn it continues, found before it is sampled."""
    body: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What is sent upstream."""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    prompt: Prompt | None = None
    """Token mode: the prompt ids and how they extend the parent's tokens."""
    logprobs_mode: str = ""
    """What the upstream's log-probs are of (`probe`)."""
    published: int = 0
    """The policy version published when its sampling began (0: none), which it records if the
    upstream names none."""


class _KeyLocks:
    """One lock per (episode, request fingerprint), alive while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: tuple[str, str]) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]


UNVERSIONED_WARNED = 4096
"""Episodes remembered as warned of a turn with no policy version, so each is warned once; the
longest-ago go first."""
HANDSHAKE_TIMEOUT_S = 10.0
"""Longest a node may take over its TLS handshake; until it is done its connection counts
against no bound of the front door."""


class _GroupCommit:
    """Ledger calls made on the event loop, gathered over one turn of the loop and committed in
    one transaction: one fsync for every turn that finished meanwhile, and no thread between the
    gateway and its ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._scheduled = False

    def run(self, op: Callable[[], T]) -> asyncio.Future[T]:
        """Commit op with the next batch, at the end of this turn of the loop; the future is done
        once the batch is durable."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        try:
            results = self.ledger.batch([op for op, _ in batch])
        except Exception as exc:  # the commit itself failed: nothing of the batch is recorded
            results = [(False, exc)] * len(batch)
        for (_, future), (ok, value) in zip(batch, results, strict=True):
            if not future.cancelled():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)


@dataclass(frozen=True)
class Peer:
    """The other end of a gateway connection."""

    host: str
    """Its address: a sandbox's own, or a node's that relays for its sandboxes."""
    node: str | None = None
    """On a port that speaks TLS (`GatewaySettings.tls`), the node its verified certificate
    names ("" if it names none); None on a plaintext port, where a node is told by its address."""

    def __str__(self) -> str:
        if self.node is None:
            return self.host
        return f"node {self.node} at {self.host}" if self.node else f"{self.host}, certified as no node"


def live_peer(e: Episode, peer: Peer, node_address: str) -> bool:
    """Whether a connection from `peer` can come from the episode's live run: over TLS, from the
    node it is placed on, named by the node's certificate, whose agent relays the gateway; in
    plaintext, from the sandbox's own address (the gateway on its node's host) or from that
    node's address (`node_address` is its agent's host:port). A preempted episode has no live
    run; any other sandbox with its key is a stale one."""
    if e.state == EpisodeState.PREEMPTED or not e.node:
        return False
    if peer.node is not None:  # a certificate says which node relays: its address says nothing
        return peer.node == e.node
    if not peer.host:
        return False
    return peer.host == e.address or peer.host == host_of(node_address)


class Gateway:
    """Serves every harness protocol for every episode's sandbox."""

    def __init__(
        self,
        settings: GatewaySettings,
        ledger: Ledger,
        episodes: Callable[[str], Episode | None],
        resumed_at: Callable[[Episode], float],
        live_from: Callable[[Episode, Peer], bool],
        renderer: ChatRenderer | None = None,
        live_run: Callable[[Connection, str], tuple[int, str]] | None = None,
        max_staleness: Callable[[Episode], int | None] | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.episodes = episodes
        """The episode a gateway key belongs to."""
        self.resumed_at = resumed_at
        """When the snapshot the episode's current run came from froze it; 0 for a fresh start."""
        self.live_from = live_from
        """Whether a connection from this peer can be the episode's live run (`live_peer`). A
        stale sandbox (on a node declared lost, or thawed after its episode moved) cannot: 409."""
        self.live_run = live_run
        """An episode's current run, and why its trajectory takes no more turns, read again in
        the transaction that records a turn (`Ledger.record`): a generation that outlives its run
        is placed by what holds when it commits, and one that outlives its episode is refused."""
        self.max_staleness = max_staleness or (lambda e: None)
        """The bound of the episode's GRPO group (`Group.max_staleness`); None for no bound or no
        group. A turn that would take a member past it is held back (`_within_bound`)."""
        self.upstream = Upstream(settings)
        self.metrics = Metrics()
        self.renderer = renderer or (
            ChatRenderer(settings.renderer, Path(settings.tokenizer), dict(settings.renderer_options))
            if settings.renderer
            else None
        )
        """The model's template and parser: prompts are token ids (None: text mode)."""
        self.dialect = DIALECTS[settings.upstream_api]
        self.probe = LogprobsProbe(self.upstream, self.dialect, self.renderer)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-state")
        self._ledger = _GroupCommit(ledger)
        self._locks = _KeyLocks()
        self._unversioned: OrderedDict[str, None] = OrderedDict()
        """Episodes warned of a turn recorded with no policy version."""
        self._loop = asyncio.new_event_loop()
        self._slots: FairSlots | None = None
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self._metrics_listener: asyncio.Server | None = None
        self.metrics_port = 0
        self._listener: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway", daemon=True)
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Gateway:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        return self

    async def _serve(self) -> None:
        self._slots = FairSlots(self.settings.max_concurrent_turns, self.settings.max_turns_per_episode)
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        for path, protocol in PROTOCOLS.items():
            app.router.add_post(path, self._route(protocol))
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=False)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        s = self.settings
        host, port = split_host_port(s.listen, "gateway listen")
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: Door(server, s.max_connections, s.max_connections_per_peer),
            host or "0.0.0.0",
            port,
            backlog=1024,
            reuse_address=True,
            ssl=s.tls.server_context() if s.tls is not None else None,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if s.tls is not None else None,
        )
        self.port = int(self._listener.sockets[0].getsockname()[1])
        if s.metrics_listen:
            metrics = web.Application()
            metrics.router.add_get("/metrics", self._metrics)
            self._metrics_runner = web.AppRunner(metrics, access_log=None)
            await self._metrics_runner.setup()
            handler = self._metrics_runner.server
            assert handler is not None
            host, port = split_host_port(s.metrics_listen, "gateway metrics listen")
            self._metrics_listener = await asyncio.get_running_loop().create_server(
                handler, host or "0.0.0.0", port, reuse_address=True
            )
            self.metrics_port = int(self._metrics_listener.sockets[0].getsockname()[1])

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.text(), content_type="text/plain", charset="utf-8")

    def logprobs_mode(self, model: str) -> str:
        """What the upstream's log-probs are of (processed, raw, or "" if it could not be told),
        checked now with this model name if not known yet."""
        return asyncio.run_coroutine_threadsafe(self.probe.mode(model), self._loop).result(timeout=60)

    @property
    def connections(self) -> int:
        """How many connections the front door has admitted and the HTTP server still holds."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._listener is not None:
                self._listener.close()
                await self._listener.wait_closed()
            if self._runner is not None:
                await self._runner.cleanup()
            if self._metrics_listener is not None:
                self._metrics_listener.close()
                await self._metrics_listener.wait_closed()
            if self._metrics_runner is not None:
                await self._metrics_runner.cleanup()
            await self.upstream.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
        self._pool.shutdown(wait=True)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- the front door ---------------------------------------------------------------------

    def _peer(self, request: web.Request) -> Peer:
        """Who sent the request: over TLS, the node its certificate names (the handshake took
        only a certificate from the cluster CA)."""
        host = request.remote or ""
        if self.settings.tls is None:
            return Peer(host)
        transport = request.transport
        return Peer(
            host, node_of(certified_identity(transport.get_extra_info("peercert") if transport else None))
        )

    def _episode(self, token: str, peer: Peer) -> tuple[Episode, float, bool] | None:
        episode = self.episodes(token)
        if episode is None:
            return None
        return episode, self.resumed_at(episode), self.live_from(episode, peer)

    async def _authenticate(self, request: web.Request) -> tuple[Episode, float]:
        """The episode whose key the request carries, and when its current run's snapshot froze it."""
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        token = token or request.headers.get("x-api-key", "").strip()
        peer = self._peer(request)
        found = await self._call(self._episode, token, peer) if token else None
        if found is None:
            raise GatewayError(401, "missing or unknown API key: use this sandbox's OPENAI_API_KEY or ANTHROPIC_API_KEY",
                               "authentication_error")  # fmt: skip
        episode, resumed_at, live = found
        if episode.state.terminal:
            raise GatewayError(403, f"episode {episode.id} has ended ({episode.state})", "permission_error")
        if not live:
            raise GatewayError(409, f"episode {episode.id} is {episode.state} on {episode.node or 'no node'}; "
                               f"this connection ({peer}) is not its live run, and nothing is recorded",
                               "conflict_error")  # fmt: skip
        return episode, resumed_at

    async def _body(self, request: web.Request, parse: Callable[[dict[str, Any]], T]) -> tuple[bytes, T]:
        """The request's body, and what `parse` makes of the JSON object it holds. A long one (a
        harness's whole conversation, megabytes of it) is decoded and parsed on the pool, so that
        it does not stall every other sandbox's stream on the event loop meanwhile."""
        raw = await self._read(request)
        if len(raw) <= INLINE_BODY_BYTES:
            return raw, _decoded(raw, parse)
        return raw, await self._call(_decoded, raw, parse)

    async def _read(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise GatewayError(
                413, f"the body of {request.content_length} bytes exceeds {limit}", "request_too_large"
            )
        try:
            return await asyncio.wait_for(request.read(), self.settings.harness_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            raise GatewayError(413, f"the body exceeds {limit} bytes", "request_too_large") from None
        except TimeoutError:
            raise GatewayError(
                408, f"the body did not arrive within {self.settings.harness_timeout_s:g} s", "timeout_error"
            ) from None

    @staticmethod
    def _refuse(protocol: Protocol, err: GatewayError) -> web.Response:
        return web.Response(status=err.status, body=protocol.error(err), content_type="application/json")

    async def _unknown(self, request: web.Request) -> web.Response:
        protocol = _ANTHROPIC if request.path.startswith("/v1/messages") else _OPENAI
        routes = ", ".join(PROTOCOLS)
        return self._refuse(protocol, GatewayError(404, f"{request.method} {request.path} is not served; use {routes}",
                                                   "not_found_error"))  # fmt: skip

    async def _models(self, request: web.Request) -> web.Response:
        try:
            await self._authenticate(request)
            reply = await self.upstream.get("/models")
        except (GatewayError, UpstreamUnreachable) as exc:
            err = exc if isinstance(exc, GatewayError) else GatewayError(502, str(exc), "upstream_error")
            return self._refuse(_OPENAI, err)
        data = json.loads(reply.body) if reply.status == 200 else {"data": []}
        models = [
            {**m, "type": "model", "display_name": m.get("id"), "created_at": "1970-01-01T00:00:00Z"}
            for m in data.get("data") or []
        ]
        listing = {"object": "list", "data": models, "has_more": False,
                   "first_id": models[0]["id"] if models else None, "last_id": models[-1]["id"] if models else None}  # fmt: skip
        return web.json_response(listing)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's count_tokens, answered by the upstream's tokenizer; nothing is recorded."""
        try:
            await self._authenticate(request)
            _, chat = await self._body(request, _chat_to_count)
            count = await self.upstream.tokenize(chat)
        except GatewayError as err:
            return self._refuse(_ANTHROPIC, err)
        except UpstreamUnreachable as exc:
            return self._refuse(_ANTHROPIC, GatewayError(502, str(exc), "upstream_error"))
        if count is None:  # no tokenizer route upstream: about four characters a token
            count = len(json.dumps(chat)) // 4
        return web.json_response({"input_tokens": count})

    def _route(self, protocol: Protocol) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                episode, resumed_at = await self._authenticate(request)
                raw, req = await self._body(request, protocol.parse)
            except GatewayError as err:
                return self._refuse(protocol, err)
            except RecursionError:  # JSON decodes deeper than canonical forms recurse
                return self._refuse(protocol, GatewayError(400, "request body nests too deep"))
            if req.dropped:
                log.debug("%s %s: left out %s", episode.id, protocol.name, ", ".join(req.dropped))
            try:
                return await self._answer(request, _Turn(episode, resumed_at, protocol, req, raw))
            except GatewayError as err:
                if err.kind == "upstream_error":  # the model server failed the run, not the harness
                    await self._outage(episode, str(err))
                return self._refuse(protocol, err)
            except Exception:
                log.exception("gateway failed on %s for %s", request.path, episode.id)
                return self._refuse(protocol, GatewayError(500, "internal gateway error", "server_error"))

        return handle

    # -- answering --------------------------------------------------------------------------

    async def _answer(self, request: web.Request, turn: _Turn) -> web.StreamResponse:
        assert self._slots is not None
        req = turn.request
        async with self._locks.hold((turn.episode.id, req.canonical.fingerprint)):
            # Under this request's lock, so no identical request can be sampled meanwhile.
            # A turn this run was never answered with is replayed (a retry, or a restored harness
            # asking again); one it was answered with is not retried, and the request is sampled
            # afresh beside it, as a model server would.
            recorded = self.ledger.find(turn.episode.id, req.canonical, turn.episode.runs)
            if recorded is not None:
                self.metrics.count("replays")
                return await self._deliver(
                    request, recorded.id, recorded.delivered, req.stream, turn.episode.runs, replay=True
                )
            parent = self.ledger.parent(turn.episode.id, req.canonical)
            body = self._upstream_body(req)
            turn = dataclasses.replace(
                turn,
                parent=parent,
                body=body,
                sampling=sampling_of(body),
                logprobs_mode=await self.probe.mode(str(req.upstream.get("model", ""))),
            )
            if self.renderer is not None:
                # Rendering a long conversation is CPU work: on the pool, off the event loop.
                prompt = await self._call(self._prompt, parent, req)
                sampling = turn.sampling
                if not sampling.max_tokens:  # a token route has no chat route's default
                    sampling = dataclasses.replace(sampling, max_tokens=self.settings.max_tokens)
                body = self._token_body(req, prompt, sampling)
                turn = dataclasses.replace(turn, prompt=prompt, sampling=sampling, body=body)
            try:
                async with self._slots.hold(turn.episode.id, self.settings.turn_wait_s):
                    # Read as sampling begins: a version published while it runs is not its own.
                    turn = dataclasses.replace(turn, published=await self._call(self.ledger.policy.published))
                    await self._within_bound(turn)
                    if req.stream:
                        return await self._stream(request, turn)
                    return await self._whole(request, turn)
            except SlotTimeout as exc:
                held = self._slots.held(turn.episode.id)
                raise GatewayError(429, f"{exc}: this episode holds {held} of them; retry shortly",
                                   "rate_limit_error") from None  # fmt: skip

    async def _within_bound(self, turn: _Turn) -> None:
        """Refuse, unsampled and unrecorded, a group member's turn that would be sampled under the
        published version while its trajectory holds tokens more than its group's `max_staleness`
        versions older: 503, which harnesses retry, so the member is held until the control loop
        runs it again from the start (`Control`, `policy.beyond_bound`)."""
        e = turn.episode
        if not e.group_id:
            return
        bound = await self._call(self.max_staleness, e)
        if bound is None:
            return
        lag = policy.beyond_bound(await self._call(self.ledger.live_versions, e.id), turn.published, bound)
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

    def _route_of(self, turn: _Turn) -> tuple[str, bool]:
        """Where the turn is sent upstream: its path, and whether below the server's root."""
        if turn.prompt is not None:
            return self.dialect.path, self.dialect.root
        return turn.request.upstream_path, False

    def _reader(self, turn: _Turn) -> TextReader | TokenReader:
        req = turn.request
        if turn.prompt is None or self.renderer is None:
            return TextReader(req.canonical.kind)
        up = req.upstream
        return TokenReader(req.canonical.kind, self.renderer, self.dialect, turn.prompt.ids, up.get("tools"),
                           str(up.get("model", "")))  # fmt: skip

    async def _outage(self, e: Episode, why: str) -> None:
        """Note that the model server failed a request of the episode's run (`Outages`)."""
        self.metrics.count("upstream_failures")
        try:
            await self._ledger.run(lambda: self.ledger.outages.failed(e.id, e.runs, why))
        except Exception:  # the harness still hears of the failure
            log.exception("could not note the upstream failure of %s", e.id)

    async def _upstream_refused(self, turn: _Turn, status: int, body: bytes) -> web.Response:
        """The model server's own error: unchanged for its own protocols, translated otherwise.
        Nothing is recorded for the turn; a failure of the server's own (not a 4xx) is noted
        against the run."""
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500].decode(errors="replace")
        if not 400 <= status < 500:
            await self._outage(turn.episode, f"model server: {status} {message}")
        if turn.protocol.passthrough:
            return web.Response(status=status, body=body, content_type="application/json")
        kind = "invalid_request_error" if 400 <= status < 500 else "upstream_error"
        err = GatewayError(status if 400 <= status < 500 else 502, f"model server: {message}", kind)
        return web.Response(status=err.status, body=turn.protocol.error(err), content_type="application/json")

    async def _whole(self, request: web.Request, turn: _Turn) -> web.StreamResponse:
        req, protocol = turn.request, turn.protocol
        started = time.monotonic()
        path, root = self._route_of(turn)
        try:
            reply = await self.upstream.post(path, turn.body, root=root)
        except UpstreamUnreachable as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None
        upstream_ms = (time.monotonic() - started) * 1000
        if reply.status != 200:
            return await self._upstream_refused(turn, reply.status, reply.body)
        reader = self._reader(turn)
        try:
            reader.add(loads(reply.body))
            g = reader.finish()
        except UpstreamFault as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None
        g.policy_version = g.policy_version or self.upstream.policy_version(reply.headers) or _version(turn)
        self._name_calls(protocol, g)
        delivered = protocol.render(g, reply.body, req)
        recorded = await self._record(turn, g, reply.body, delivered, upstream_ms, sending=True)
        return await self._deliver(
            request, recorded.id, delivered, False, turn.episode.runs, recorded.sending_at
        )

    async def _deliver(
        self,
        request: web.Request,
        turn_id: int,
        data: bytes,
        stream: bool,
        run: int,
        sending_at: float | None = None,
        *,
        replay: bool = False,
    ) -> web.StreamResponse:
        """Send a recorded answer whole. The delivery is noted durably as under way before it
        goes out (`sending_at`: a fresh turn's record did so already, then), and as delivered to
        `run` only once it is out."""
        headers = _EVENT_STREAM if stream else {"Content-Type": "application/json"}
        response = web.StreamResponse(status=200, headers=headers)
        response.content_length = len(data)
        at = time.time() if sending_at is None else sending_at
        if sending_at is None:
            await self._ledger.run(lambda: self.ledger.sending(turn_id, run, at))
        if not await self._to_harness(request, response, data, eof=True):
            log.info("a harness went away before turn %d was delivered; its retry is a replay", turn_id)
            await self._ledger.run(lambda: self.ledger.unsent(turn_id))
            return response
        await self._delivered(turn_id, run, at, replay)
        return response

    async def _to_harness(
        self, request: web.Request, response: web.StreamResponse, data: bytes, eof: bool = False
    ) -> bool:
        """Send `data` (the headers first, if not yet sent); False if the harness went away, or
        took no part of it for `harness_timeout_s` (then its connection is cut, so that it never
        reads half an event)."""

        async def send() -> None:
            if not response.prepared:
                await response.prepare(request)
            await response.write(data)
            if eof:
                await response.write_eof()

        try:
            await asyncio.wait_for(send(), self.settings.harness_timeout_s)
        except (ConnectionError, RuntimeError):
            return False
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
            return False
        return True

    async def _delivered(self, turn_id: int, run: int, at: float, replay: bool = False) -> None:
        """Note, durably, that a delivery to `run` whose last part went out at `at` reached its
        end. `at` is taken before that part left: the harness may have had it from then, so a
        snapshot that froze the sandbox later holds the turn. An identical request that waits for
        this one's lock then finds the turn answered."""
        await self._ledger.run(lambda: self.ledger.delivered(turn_id, at, run, replay=replay))

    async def _stream(self, request: web.Request, turn: _Turn) -> web.StreamResponse:
        started = time.monotonic()
        path, root = self._route_of(turn)
        try:
            async with self.upstream.stream(path, turn.body, root=root) as upstream:
                if upstream.status != 200:
                    return await self._upstream_refused(turn, upstream.status, await upstream.body())
                return await self._relay(request, turn, upstream, started)
        except UpstreamUnreachable as exc:
            raise GatewayError(502, str(exc), "upstream_error") from None

    async def _relay(
        self, request: web.Request, turn: _Turn, upstream: Stream, started: float
    ) -> web.StreamResponse:
        protocol, req = turn.protocol, turn.request
        response = web.StreamResponse(status=200, headers=_EVENT_STREAM)
        delivered = bytearray()
        gone = False

        async def send(data: bytes) -> None:
            nonlocal gone
            if data and not gone:
                # The harness froze or left: the generation still runs to its end.
                gone = not await self._to_harness(request, response, data)

        gone = not await self._to_harness(request, response, b"")
        encoder = protocol.encoder(req, tokens=turn.prompt is not None)
        reader = self._reader(turn)
        try:
            async for event, data in upstream.events():
                if reader.add(data):
                    out = encoder.chunk(event, data, reader.generation)
                    delivered += out
                    await send(out)
            if not upstream.done:
                raise UpstreamUnreachable("the model server's stream ended before [DONE]")
            g = reader.finish()
        except (UpstreamUnreachable, UpstreamFault) as exc:
            # A cut stream is never a turn: nothing is recorded, and the harness is told.
            await send(protocol.stream_error(GatewayError(502, str(exc), "upstream_error")))
            if not gone:
                await self._to_harness(request, response, b"", eof=True)
            return response
        g.policy_version = (
            g.policy_version or self.upstream.policy_version(upstream.headers) or _version(turn)
        )
        self._name_calls(protocol, g)
        tail = encoder.close(g)
        terminal = encoder.terminal(g)
        delivered += tail
        await send(tail)
        upstream_ms = (time.monotonic() - started) * 1000
        try:
            recorded = await self._record(
                turn, g, bytes(upstream.raw), bytes(delivered + terminal), upstream_ms, sending=not gone
            )
        except GatewayError as err:  # the episode ended meanwhile: no terminal event
            await send(protocol.stream_error(err))
            if not gone:
                await self._to_harness(request, response, b"", eof=True)
            return response
        await send(terminal)
        if not gone:
            # The terminal event is out: delivered. A harness that hangs up once it has read it
            # may refuse the response's end, which changes nothing.
            await self._to_harness(request, response, b"", eof=True)
            assert recorded.sending_at is not None
            await self._delivered(recorded.id, turn.episode.runs, recorded.sending_at)
        elif recorded.sending_run:
            await self._ledger.run(lambda: self.ledger.unsent(recorded.id))
        return response

    @staticmethod
    def _name_calls(protocol: Protocol, g: Generation) -> None:
        if not protocol.passthrough or g.mode == "tokens":
            for i, call in enumerate(g.tool_calls):
                call.id = protocol.call_id(call.id, i, g)

    async def _record(
        self, turn: _Turn, g: Generation, response: bytes, delivered: bytes, upstream_ms: float, sending: bool
    ) -> RecordedTurn:
        e, req = turn.episode, turn.request
        lineage = (
            turn.prompt.lineage if turn.prompt is not None else extension(turn.parent, g.prompt_token_ids)
        )
        live_run = self.live_run
        try:
            recorded = await self._ledger.run(
                lambda: self.ledger.record(
                    e.id, e.runs, turn.resumed_at, req.canonical, turn.raw, g.answer(), response,
                    turn.protocol.name, delivered, g.token_ids, g.logprobs, g.prompt_token_ids, g.policy_version,
                    upstream_ms, lineage=lineage, mode=g.mode, finish_reason=g.finish_reason, sampling=turn.sampling,
                    logprobs_mode=turn.logprobs_mode, tools_key=req.canonical.tools_key,
                    live_run=(lambda db: live_run(db, e.id)) if live_run is not None else None,
                    sending=sending, spawns=edges.spawns([c.arguments for c in g.tool_calls]),
                )
            )  # fmt: skip
        except Conflict as exc:
            raise GatewayError(409, f"{exc}; nothing is recorded", "conflict_error") from None
        self.metrics.turn(recorded)
        if not recorded.policy_version:
            self._warn_unversioned(e.id)
        return recorded

    def _warn_unversioned(self, episode_id: str) -> None:
        """Say, once per episode, that a turn was recorded with no policy version."""
        if episode_id in self._unversioned:
            return
        self._unversioned[episode_id] = None
        if len(self._unversioned) > UNVERSIONED_WARNED:
            self._unversioned.popitem(last=False)
        log.warning(
            "episode %s: a turn was recorded with no policy version: the model server sent no %s header "
            "and no version is published (PublishPolicy, `stasis policy publish N`); its tokens have no "
            "staleness (further such turns of this episode are counted in "
            "stasis_gateway_policy_version_unknown_total, not logged)",
            episode_id, self.settings.policy_version_header,
        )  # fmt: skip


def _version(turn: _Turn) -> str:
    """The version a turn records when the upstream names none: the one published when its
    sampling began; "" if none was."""
    return str(turn.published) if turn.published else ""


def _decoded(raw: bytes, parse: Callable[[dict[str, Any]], T]) -> T:
    """`parse` of the JSON object `raw` holds; GatewayError (400) if it holds none."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, f"request body is not JSON: {exc}") from None
    except RecursionError:
        raise GatewayError(400, "request body nests too deep") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return parse(body)


def _chat_to_count(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic count_tokens body as the chat whose prompt the upstream counts."""
    tools, _ = anthropic_tools(body.get("tools"))
    return {"model": body.get("model", ""), "messages": anthropic_messages(body), "tools": tools}
