"""A gateway and its ledger in-process, before the real reference model, for the `test_gateway_*`
tests (and `test_tokens`, `test_slots`): its episodes are the test's records, its peers known
by address (`NODES`)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anthropic
import openai

from orchestrator.domain import Episode, EpisodeSpec, EpisodeState
from orchestrator.gateway import Gateway, GatewaySettings, live_peer
from orchestrator.reference_model import ReferenceModelServer
from orchestrator.trajectory import Ledger

PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "shell", "description": "run a command", "parameters": PARAMETERS},
    }
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "shell", "description": "run a command", "parameters": PARAMETERS}
]
ANTHROPIC_TOOLS = [{"name": "shell", "description": "run a command", "input_schema": PARAMETERS}]
USER = {"role": "user", "content": "Make a notes file."}


@dataclass
class World:
    gateway: Gateway
    ledger: Ledger
    model: ReferenceModelServer
    episodes: dict[str, Episode]
    resumed_at: dict[str, float] = field(default_factory=dict)
    upstream_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    def post(
        self,
        body: Any,
        token: str = "tok-1",
        path: str = "/v1/chat/completions",
        raw: bytes | None = None,
        source: str = "127.0.0.1",
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.gateway.port, timeout=30, source_address=(source, 0)
        )
        data = raw if raw is not None else json.dumps(body).encode()
        # Closed however the exchange ends: a socket left to a traceback's frames closes only when
        # the collector frees them, in whatever later test that is, as a ResourceWarning there.
        try:
            conn.request(
                "POST", path, data, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            )
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def set_run(self, episode_id: str, run: int, resumed_at: float) -> None:
        self.episodes[episode_id] = replace(self.episodes[episode_id], runs=run)
        self.resumed_at[episode_id] = resumed_at

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="tok-1", max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base, api_key="tok-1", max_retries=0)


def make_episode(episode_id: str, token: str, state: EpisodeState = EpisodeState.RUNNING) -> Episode:
    spec = EpisodeSpec(image="base", command=("true",))
    return Episode(id=episode_id, spec=spec, state=state, reason="", submitted_at=0, updated_at=0,
                   address="10.209.0.2", token=token, runs=1, node="node-1")  # fmt: skip


NODES = {"node-1": "127.0.0.1:7071", "node-2": "127.0.0.2:7071"}
"""Where each node's agent listens: its connections to the gateway come from that host."""


def make_world(
    tmp_path: Path,
    upstream: str,
    model: ReferenceModelServer,
    ledger: Ledger | None = None,
    max_staleness: Callable[[Episode], int | None] | None = None,
    family: bool = False,
    **settings: Any,
) -> World:
    ledger = ledger or Ledger.sqlite(tmp_path / "ledger.db")
    episodes = {
        "ep-1": make_episode("ep-1", "tok-1"),
        "ep-done": make_episode("ep-done", "tok-done", EpisodeState.SUCCEEDED),
    }
    resumed: dict[str, float] = {}
    gateway = Gateway(
        GatewaySettings(listen="127.0.0.1:0", upstream=upstream, **settings),
        ledger,
        lambda token: next((e for e in episodes.values() if e.token == token), None),
        lambda e: resumed.get(e.id, 0.0),
        lambda e, peer: live_peer(e, peer, NODES.get(e.node, "")),
        live_run=lambda db, episode_id: _live_run(episodes[episode_id]),
        max_staleness=max_staleness,
        # As the state store's `keyed_by`: the live fork children holding the episode's key.
        family=(lambda owner: [e for e in episodes.values() if e.key_of == owner and not e.state.terminal])
        if family
        else None,
    ).start()
    return World(gateway, ledger, model, episodes, resumed)


def _live_run(e: Episode) -> tuple[int, str]:
    """As `state.sql.live_run` reads it from the episodes table, here from the test's records."""
    return e.runs, f"episode {e.id} has ended ({e.state})" if e.state.terminal else ""


def delivered_turn(world: World, index: int = -1) -> Any:
    """The turn once its delivery is noted (that happens just after its last byte went out)."""
    deadline = time.monotonic() + 10
    while (turn := world.ledger.turns("ep-1")[index]).delivered_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return turn


def count_generations(world: World, delay_s: float = 0.0) -> None:
    """Count (and optionally slow) the reference model's generations: the upstream boundary."""
    model = world.model.model
    for name in ("chat_answer", "completion", "generate"):
        method = getattr(type(model), name)

        def counted(body: Any, method: Any = method) -> Any:
            world.upstream_calls.append(dict(body))
            time.sleep(delay_s)
            return method(model, body)

        setattr(model, name, counted)


def chat_body(*messages: dict[str, Any], seed: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "model": "reference",
        "messages": list(messages),
        "tools": TOOLS,
        "seed": seed,
        "temperature": 1.0,
        **extra,
    }


def restored_run(world: World) -> None:
    """The episode's next run, from a snapshot that froze the sandbox once every turn so far had
    been delivered."""
    frozen = max(t.delivered_at or 0.0 for t in world.ledger.turns("ep-1")) + 0.001
    world.set_run("ep-1", run=world.episodes["ep-1"].runs + 1, resumed_at=frozen)
