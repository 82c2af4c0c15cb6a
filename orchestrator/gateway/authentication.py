"""Who may use the gateway: a request carries its episode's key, and comes from that episode's
live run, before anything of its body is read.

The key maps to its episode (`episodes`); the connection's peer, a sandbox or the node relaying
for it, must be where the episode's current run is (`live_peer`). An unknown key is 401, an ended
episode 403, and a stale sandbox (on a node declared lost, or thawed after its episode moved) 409.

A fork child's harness holds the key of the first episode of its fork line (its memory is that
episode's), so one key may be presented by that episode and by each of its live fork children
(`family`). The request's episode is the one of them whose live run the peer can be: in plaintext
the sandbox's own address tells them apart. A node that relays (over TLS, or a plaintext
cluster's node address) speaks for every sandbox placed on it, so two of one key's holders
placed on one node cannot be told apart: such a request is refused with 409 naming them, rather
than recorded on a guess. The scheduler should place a fork's children apart from each other and
from their parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from orchestrator.domain import Episode, EpisodeState
from orchestrator.gateway.commit import StatePool
from orchestrator.gateway.protocols import GatewayError
from orchestrator.gateway.settings import GatewaySettings
from protos.shared.address import host_of
from protos.shared.tls import certified_identity, node_of


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


class Authentication:
    """Tells each request's episode by its key, and refuses it unless it comes from the live run."""

    def __init__(
        self,
        settings: GatewaySettings,
        pool: StatePool,
        episodes: Callable[[str], Episode | None],
        resumed_at: Callable[[Episode], float],
        live_from: Callable[[Episode, Peer], bool],
        family: Callable[[str], Sequence[Episode]] = lambda episode_id: (),
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.episodes = episodes
        """The episode a gateway key belongs to."""
        self.resumed_at = resumed_at
        """When the snapshot the episode's current run came from froze it; 0 for a fresh start."""
        self.live_from = live_from
        """Whether a connection from this peer can be the episode's live run (`live_peer`). A
        stale sandbox (on a node declared lost, or thawed after its episode moved) cannot: 409."""
        self.family = family
        """The live fork children whose harnesses hold this episode's key (`Episode.key_of`)."""

    async def episode(self, request: web.Request) -> tuple[Episode, float]:
        """The episode whose key the request carries, and when its current run's snapshot froze it."""
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        token = token or request.headers.get("x-api-key", "").strip()
        peer = self._peer(request)
        found = await self.pool.call(self._found, token, peer) if token else None
        if found is None:
            raise GatewayError(401, "missing or unknown API key: use this sandbox's OPENAI_API_KEY or ANTHROPIC_API_KEY",
                               "authentication_error")  # fmt: skip
        episode, resumed_at, live = found
        if len(live) > 1:
            raise GatewayError(409, f"this connection ({peer}) can be the live run of each of {', '.join(e.id for e in live)}, "
                               f"which hold one gateway key (a fork's family) on one node; it cannot be told which "
                               "asks, and nothing is recorded", "conflict_error")  # fmt: skip
        if live:
            return live[0], resumed_at
        if episode.state.terminal:
            raise GatewayError(403, f"episode {episode.id} has ended ({episode.state})", "permission_error")
        raise GatewayError(409, f"episode {episode.id} is {episode.state} on {episode.node or 'no node'}; "
                           f"this connection ({peer}) is not its live run, nor a live fork child's holding its "
                           "key, and nothing is recorded", "conflict_error")  # fmt: skip

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

    def _found(self, token: str, peer: Peer) -> tuple[Episode, float, list[Episode]] | None:
        """The key's episode, when the peer's episode's current run was frozen, and the holders of
        the key (the episode and its live fork children) whose live run the peer can be."""
        episode = self.episodes(token)
        if episode is None:
            return None
        holders = [episode, *self.family(episode.id)]
        live = [e for e in holders if not e.state.terminal and self.live_from(e, peer)]
        return episode, self.resumed_at(live[0] if len(live) == 1 else episode), live
