"""The agent's side of node membership: register with the orchestrator, then heartbeat.

Given several orchestrators (replicas sharing one database, of which one leads), the agent
stays with the one that answers and moves on to the next when a call fails: a standby refuses
with UNAVAILABLE, and a dead leader does not answer at all. When this node's certificate is
replaced (renewed), it dials the same orchestrator again, to present the new one.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from protos.shared.tls import ORCHESTRATOR
from protos.stasis.v1 import stasis_pb2 as spb
from protos.stasis.v1 import stasis_pb2_grpc as spb_grpc
from sandbox_agent.node import Node
from sandbox_agent.server.service import image_to_pb, node_info_pb, sandbox_to_pb

log = logging.getLogger(__name__)


class Registration:
    """A thread that keeps this node known to the orchestrator; it survives orchestrator restarts."""

    def __init__(self, node: Node, orchestrators: list[str], advertise: str) -> None:
        self.node = node
        self.advertise = advertise
        self.interval = node.settings.heartbeat_s
        self._orchestrators = orchestrators
        self._current = -1
        self._stamp: object = None
        """The certificate files' `TlsFiles.stamp` when the channel was dialled."""
        self._channel: grpc.Channel
        self._registry: spb_grpc.NodeRegistryStub
        self._connect_next()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"registration-{node.name}", daemon=True)
        self._last_error = ""

    def start(self) -> None:
        self._thread.start()

    def _connect_next(self) -> None:
        """Dial the next orchestrator in the list (the first, at start)."""
        if self._current >= 0:
            if len(self._orchestrators) == 1:
                return  # the one channel reconnects by itself
            self._channel.close()
        self._current = (self._current + 1) % len(self._orchestrators)
        self._dial()

    def _dial(self) -> None:
        address = self._orchestrators[self._current]
        tls = self.node.settings.tls
        # With TLS, this node's certificate is its name: the orchestrator takes no other from it.
        self._stamp = tls.stamp() if tls else None
        self._channel = tls.channel(address, ORCHESTRATOR) if tls else grpc.insecure_channel(address)
        self._registry = spb_grpc.NodeRegistryStub(self._channel)

    def _redial_if_renewed(self) -> None:
        """Dial the same orchestrator again if the certificate files changed: the open connection
        goes on with the old certificate, which the registry refuses once it has expired."""
        tls = self.node.settings.tls
        if tls is not None and tls.stamp() != self._stamp:
            log.info("node %s has a new certificate; dialling the orchestrator again", self.node.name)
            self._channel.close()
            self._dial()

    def leave(self, timeout_s: float) -> bool:
        """Have the orchestrator drain this node, then wait up to timeout_s for every sandbox to be
        checkpointed and moved away (heartbeats go on meanwhile). True if none is left."""
        try:
            self._registry.Leave(spb.LeaveRequest(node=self.node.name), timeout=10)
        except grpc.RpcError as exc:
            log.warning(
                "node %s could not ask to be drained: %s: %s", self.node.name, exc.code().name, exc.details()
            )
            return False
        log.info(
            "node %s is leaving: waiting up to %.0f s for its sandboxes to move", self.node.name, timeout_s
        )
        deadline = time.monotonic() + timeout_s
        while self.node.list():
            if time.monotonic() > deadline:
                log.warning(
                    "node %s still holds sandboxes after %.0f s; stopping anyway", self.node.name, timeout_s
                )
                return False
            time.sleep(1.0)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._channel.close()

    def _run(self) -> None:
        registered = False
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._redial_if_renewed()
                sandboxes = self.node.list()
                if not registered:
                    reply = self._registry.RegisterNode(
                        spb.RegisterNodeRequest(
                            info=node_info_pb(self.node, sandboxes),
                            address=self.advertise,
                            sandboxes=[sandbox_to_pb(s) for s in sandboxes],
                        ),
                        timeout=10,
                    )
                    self.interval = reply.heartbeat_interval_s or self.interval
                    registered = True
                    log.info("node %s registered with the orchestrator as %s", self.node.name, self.advertise)
                else:
                    ack = self._registry.Heartbeat(
                        spb.HeartbeatRequest(
                            node=self.node.name,
                            sandboxes=[sandbox_to_pb(s) for s in sandboxes],
                            images=[image_to_pb(i) for i in self.node.images.list()],
                        ),
                        timeout=10,
                    )
                    registered = ack.known
                self._last_error = ""
            except grpc.RpcError as exc:
                message = f"{self._orchestrators[self._current]}: {exc.code().name}: {exc.details()}"
                if message != self._last_error:
                    log.warning("node %s cannot reach the orchestrator at %s", self.node.name, message)
                    self._last_error = message
                registered = False
                self._connect_next()
            except Exception:
                log.exception("node %s heartbeat failed", self.node.name)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
