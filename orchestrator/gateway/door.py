"""The gateway's front door: how many connections one peer, and everyone, may hold open.

A harness that opens connections without end (idle keep-alives, a loop that never closes) would
otherwise take the file descriptors every other sandbox needs. A connection over either bound is
answered `503` with `Retry-After` and closed before anything of it is read; the HTTP clients of
every harness retry that. The peer is the sandbox's own address, or, where a node relays the
gateway to its sandboxes (`--gateway-forward`), that node's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from protos.shared.pump import refusal

log = logging.getLogger(__name__)


def _host(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if peer else ""


class Door(asyncio.Protocol):
    """Hands an admitted connection to the HTTP server; answers any other with 503 and closes it."""

    def __init__(self, server: web.Server, total: int, per_peer: int) -> None:
        self.server, self.total, self.per_peer = server, total, per_peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = _host(transport)
        held = [_host(handler.transport) for handler in self.server.connections]
        if len(held) >= self.total:
            refused = f"the gateway holds {len(held)} connections, its most; retry shortly"
        elif held.count(peer) >= self.per_peer:
            refused = f"{peer} holds {self.per_peer} connections to the gateway, its most; close one or retry"
        else:
            handler = self.server()
            transport.set_protocol(handler)
            handler.connection_made(transport)
            return
        log.warning("gateway refused a connection from %s: %s", peer, refused)
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(refusal(refused))
        transport.close()

    def data_received(self, data: bytes) -> None:  # a refused connection's bytes: ignored
        pass

    def eof_received(self) -> Any:
        return None
