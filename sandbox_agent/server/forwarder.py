"""In a cluster the gateway runs with the orchestrator; each node forwards 169.254.1.1:<port>
to it, so a sandbox reaches the gateway at the same address and port on every node.

With the node's certificate (`AgentSettings.tls`) the hop to the gateway is TLS: the relay
presents the certificate, by which the gateway knows which node relays (and so for which
episodes it may speak), and accepts only a gateway whose certificate, from the cluster CA, names
the orchestrator. Keys, prompts and answers never cross the cluster's network in plaintext. The
sandbox's own hop, over its veth to 169.254.1.1 on this node, stays plain HTTP.

The gateway sees the node for every sandbox on it, so it cannot tell one sandbox's connections
from another's: the relay caps what each sandbox address holds open (`max_per_sandbox`), and
answers one more with 503 before anything reaches the gateway, as the gateway's own front door
does. One harness that opens connections without end takes no neighbour's share of the node's.

One event loop on a thread of its own relays every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections import Counter

from protos.shared.address import split_host_port
from protos.shared.pump import CHUNK, pump, refusal
from protos.shared.tls import ORCHESTRATOR, TlsFiles

log = logging.getLogger(__name__)


MAX_PER_SANDBOX = 64
"""Connections one sandbox may hold through the relay: a harness keeps a few, an agent with
many parallel calls a few dozen."""
DIAL_TIMEOUT_S = 10.0
"""Longest the relay waits to reach the gateway and finish the TLS handshake."""


class Forwarder:
    """A relay from a local listen address to the gateway at `target`: TLS with `tls` (the
    node's certificate), plain TCP without."""

    def __init__(
        self,
        listen: tuple[str, int],
        target: tuple[str, int],
        max_per_sandbox: int = MAX_PER_SANDBOX,
        tls: TlsFiles | None = None,
    ) -> None:
        self.target = target
        self.max_per_sandbox = max_per_sandbox
        self._tls_files = tls
        self._tls: ssl.SSLContext | None = None
        self._tls_stamp: object = None
        self._client_tls()  # an unreadable certificate fails the start, naming the file
        self._held: Counter[str] = Counter()
        self._open: set[asyncio.StreamWriter] = set()
        """Both ends of every connection being relayed."""
        self._lock = threading.Lock()
        self.sock = socket.create_server(listen, reuse_port=False)
        self.address = self.sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-forwarder", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()

        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._relay, sock=self.sock, limit=CHUNK)

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._open):  # each relay then ends, its reads and writes failing
                writer.transport.abort()
            relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if relays:
                await asyncio.wait(relays, timeout=5)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self.sock.close()
        if not self._loop.is_running():
            self._loop.close()

    async def _relay(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        peer = client.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        with self._lock:
            admitted = self._held[source] < self.max_per_sandbox
            if admitted:
                self._held[source] += 1
        if not admitted:
            log.warning(
                "gateway relay refused a connection from %s: it holds %d", source, self.max_per_sandbox
            )
            client.write(
                refusal(f"{source} holds {self.max_per_sandbox} connections to the gateway, its most")
            )
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(client.drain(), DIAL_TIMEOUT_S)
            client.close()
            return
        # Its listening socket names no protocol, so asyncio leaves Nagle on: a reply that comes
        # in two TLS records (head, body) would wait out the harness's delayed ACK, 40 ms.
        client.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ends = [client]
        self._open.add(client)
        try:
            try:
                gateway_reader, gateway = await asyncio.wait_for(self._dial(), DIAL_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                log.warning("gateway %s:%d unreachable: %s", *self.target, exc or "timed out")
                return
            ends.append(gateway)
            self._open.add(gateway)
            # The connection counts until both directions are over. A frozen harness holds the
            # gateway's side back, not this node's memory.
            await pump((client_reader, client), (gateway_reader, gateway))
        finally:
            for writer in ends:
                writer.close()
                self._open.discard(writer)
            self._done(source)

    def _client_tls(self) -> ssl.SSLContext | None:
        """The node's certificate as its files hold it now: one renewed through `ClusterJoin`
        is presented from the next dial on (a file caught half rewritten keeps the last one)."""
        if self._tls_files is None:
            return None
        stamp = self._tls_files.stamp()
        if stamp != self._tls_stamp:
            try:
                self._tls = self._tls_files.client_context()
                self._tls_stamp = stamp
            except ValueError:
                if self._tls is None:
                    raise
                log.warning("the relay keeps its node certificate: the new one is not readable yet")
        return self._tls

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.target
        context = self._client_tls()
        if context is None:
            return await asyncio.open_connection(host, port, limit=CHUNK)
        return await asyncio.open_connection(
            host,
            port,
            limit=CHUNK,
            ssl=context,
            server_hostname=ORCHESTRATOR,
            ssl_handshake_timeout=DIAL_TIMEOUT_S,
        )

    def _done(self, source: str) -> None:
        with self._lock:
            self._held[source] -= 1
            if self._held[source] <= 0:
                del self._held[source]

    def held(self, source: str) -> int:
        """Connections the sandbox at this address holds through the relay."""
        with self._lock:
            return self._held[source]


def parse_target(value: str) -> tuple[str, int]:
    host, port = split_host_port(value, "--gateway-forward")
    if not host:
        raise ValueError(f"--gateway-forward: {value!r} names no host; write HOST:PORT")
    return host, port
