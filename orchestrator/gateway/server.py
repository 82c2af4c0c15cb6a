"""The inference gateway: the harness's only model endpoint and the ledger's only writer.

`Gateway` wires its parts and runs them: each request is authenticated by its episode's key
before its body is read (`authentication`), routed by its protocol (`routes`), answered from the
ledger if it repeats a recorded turn and otherwise sampled upstream (`answering`), relayed whole
or streamed (`relay`), recorded (`recording`) and delivered (`delivery`). Ledger writes go in
group commits, and state reads on a small thread pool (`commit`).

Served on aiohttp in an event loop of its own, behind a front door that bounds connections
(`door`); counters on a port of their own (`metrics`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from aiohttp import web

from orchestrator.domain import Episode
from orchestrator.gateway.answering import Answers
from orchestrator.gateway.authentication import Authentication, Peer
from orchestrator.gateway.commit import GroupCommit, StatePool
from orchestrator.gateway.delivery import Delivery
from orchestrator.gateway.dialects import DIALECTS
from orchestrator.gateway.door import Door
from orchestrator.gateway.metrics import Metrics
from orchestrator.gateway.probe import LogprobsProbe
from orchestrator.gateway.recording import Recorder
from orchestrator.gateway.relay import Relay
from orchestrator.gateway.rendering import ChatRenderer
from orchestrator.gateway.routes import Routes
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.gateway.upstream import Upstream
from orchestrator.state.sql import Connection
from orchestrator.trajectory.ledger import Ledger
from protos.shared.address import split_host_port

HANDSHAKE_TIMEOUT_S = 10.0
"""Longest a node may take over its TLS handshake; until it is done its connection counts
against no bound of the front door."""


class Gateway:
    """Serves every harness protocol for every episode's sandbox.

    `episodes` maps a gateway key to its episode; `resumed_at` says when the snapshot of the
    episode's current run froze it; `live_from` whether a peer can be its live run
    (`authentication`). `live_run` reads the episode's run in the transaction that records a
    turn (`recording`); `max_staleness` is a group member's bound (`answering`); `family` gives the
    live fork children that hold an episode's key (`authentication`)."""

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
        family: Callable[[str], Sequence[Episode]] | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
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
        self._pool = StatePool()
        commit = GroupCommit(ledger)
        delivery = Delivery(settings, ledger, commit)
        recorder = Recorder(settings, ledger, commit, self.metrics, live_run)
        relay = Relay(self.upstream, self.dialect, self.renderer, delivery, recorder)
        answers = Answers(
            settings, ledger, self._pool, self.metrics, self.probe, self.dialect, self.renderer, relay, delivery,
            max_staleness or (lambda e: None),
        )  # fmt: skip
        authentication = Authentication(
            settings, self._pool, episodes, resumed_at, live_from, family or (lambda episode_id: ())
        )
        self._routes = Routes(settings, self._pool, authentication, answers, self.upstream, recorder)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self._metrics_listener: asyncio.Server | None = None
        self.metrics_port = 0
        self._listener: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway", daemon=True)
        self.port = 0

    def start(self) -> Gateway:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        self._routes.add_to(app)
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
        self._pool.shutdown()
