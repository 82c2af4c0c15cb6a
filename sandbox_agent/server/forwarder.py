"""In a cluster the gateway runs with the orchestrator; each node forwards 169.254.1.1:<port>
to it, so a sandbox reaches the gateway at the same address and port on every node.

The gateway sees the node's address for every sandbox on it, so it cannot tell one sandbox's
connections from another's: the relay caps what each sandbox address holds open
(`max_per_sandbox`), and answers one more with 503 before anything reaches the gateway, as the
gateway's own front door does. One harness that opens connections without end takes no
neighbour's share of the node's."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import threading
from collections import Counter

log = logging.getLogger(__name__)


MAX_PER_SANDBOX = 64
"""Connections one sandbox may hold through the relay: a harness keeps a few, an agent with
many parallel calls a few dozen."""


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": {"type": "overloaded_error", "message": message}}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction; when it ends, end both, and close the socket this direction read."""
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    src.close()


class Forwarder:
    """A TCP relay from a local listen address to a target, one thread pair per connection."""

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], max_per_sandbox: int = MAX_PER_SANDBOX
    ) -> None:
        self.target = target
        self.max_per_sandbox = max_per_sandbox
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.sock = socket.create_server(listen, reuse_port=False)
        self.address = self.sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name="gateway-forwarder", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                client, peer = self.sock.accept()
            except OSError:
                return  # closed
            source = str(peer[0])
            with self._lock:
                admitted = self._held[source] < self.max_per_sandbox
                if admitted:
                    self._held[source] += 1
            if not admitted:
                log.warning(
                    "gateway relay refused a connection from %s: it holds %d", source, self.max_per_sandbox
                )
                with contextlib.suppress(OSError):
                    client.sendall(
                        _refusal(
                            f"{source} holds {self.max_per_sandbox} connections to the gateway, its most"
                        )
                    )
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError as exc:
                log.warning("gateway %s:%d unreachable: %s", *self.target, exc)
                client.close()
                self._done(source)
                continue
            ends = threading.Barrier(2, action=functools.partial(self._done, source))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(a, b, ends), daemon=True).start()

    @staticmethod
    def _relay(src: socket.socket, dst: socket.socket, ends: threading.Barrier) -> None:
        _pipe(src, dst)
        ends.wait()  # the connection counts until both directions are over

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
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--gateway-forward: {value!r} must be HOST:PORT")
    return host, int(port)
