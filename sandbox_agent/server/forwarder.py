"""In a cluster the gateway runs with the orchestrator; each node forwards 169.254.1.1:<port>
to it, so a sandbox reaches the gateway at the same address and port on every node."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

log = logging.getLogger(__name__)


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

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
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
                client, _ = self.sock.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError as exc:
                log.warning("gateway %s:%d unreachable: %s", *self.target, exc)
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def parse_target(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--gateway-forward: {value!r} must be HOST:PORT")
    return host, int(port)
