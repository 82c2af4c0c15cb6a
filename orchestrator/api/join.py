"""Nodes joining the cluster: a node that proves which node it is gets a certificate naming it.

The proof is its agent pod's service-account token (`control.kube.NodeIdentities`): Kubernetes
says which pod holds it, and that pod says which node it runs on. The certificate is signed by
the cluster CA, whose key only the orchestrator holds, and names that node alone; with it the
node registers, heartbeats and serves its sandboxes (`protos.shared.tls`). It lasts a day
(`AuthSettings.node_certificate_s`), and the node joins again for the next before it runs out:
nothing revokes a certificate, so a copied key outlives neither its lifetime nor the pod.

Anyone who reaches the port may ask, and each request costs a TokenReview on the Kubernetes API
and, if it passes, a signature: requests are throttled per peer address and in all (`Throttle`).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import grpc
from cryptography import x509

from orchestrator.api.status import required, rpc
from orchestrator.domain import FailedPrecondition, InvalidArgument, PermissionDenied, TemporaryError
from protos.shared import pki
from protos.shared.address import host_of
from protos.shared.tls import node_identity
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class Identities(Protocol):
    def node_of(self, token: str) -> str:
        """The node the holder of `token` runs on; raises if the token proves nothing."""


JOIN_RATE = 2.0
"""Join requests a second one peer address may make, after a first burst of `JOIN_BURST`; all
peers together may make ten times as many. A fleet of agents starting at once joins at 20 a
second (a thousand nodes in under a minute, each retrying while it waits)."""
JOIN_BURST = 10


class Throttle:
    """Token buckets: each peer may make `rate` requests a second after a burst of `burst`, and
    all peers together ten times that. Only the `peers` heard from last are remembered."""

    def __init__(
        self, rate: float = JOIN_RATE, burst: int = JOIN_BURST, peers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.rate, self.burst, self.peers, self._clock = rate, burst, peers, clock
        self._lock = threading.Lock()
        self._by_peer: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Peer -> (requests it may still make, when that was counted), the latest last."""
        self._all: tuple[float, float] | None = None

    def admit(self, peer: str) -> float:
        """0 if `peer` may make a request now (and it is counted), else the seconds to wait."""
        with self._lock:
            now = self._clock()
            mine = _refill(self._by_peer.get(peer), self.rate, self.burst, now)
            everyone = _refill(self._all, self.rate * 10, self.burst * 10, now)
            if mine < 1 or everyone < 1:
                return max((1 - mine) / self.rate, (1 - everyone) / (self.rate * 10), 0.0)
            self._by_peer[peer] = (mine - 1, now)
            self._by_peer.move_to_end(peer)
            self._all = (everyone - 1, now)
            if len(self._by_peer) > self.peers:
                self._by_peer.popitem(last=False)
            return 0.0


def _refill(bucket: tuple[float, float] | None, rate: float, burst: float, now: float) -> float:
    if bucket is None:
        return burst
    tokens, at = bucket
    return min(burst, tokens + (now - at) * rate)


def _address(peer: str) -> str:
    """The address of a gRPC peer ("ipv4:10.0.0.7:51234", "ipv6:[fd00::7]:51234"), without its port."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer  # a Unix socket's path names its caller whole
    return host_of(address, "peer")


class JoinService(pb_grpc.ClusterJoinServicer):
    def __init__(
        self,
        ca: tuple[x509.Certificate, pki.CaKey] | None,
        identities: Identities | None,
        throttle: Throttle | None = None,
        lifetime: datetime.timedelta = datetime.timedelta(days=1),
    ) -> None:
        self.ca = ca
        self.identities = identities
        self.throttle = throttle or Throttle()
        self.lifetime = lifetime
        """How long each certificate it issues lasts (`AuthSettings.node_certificate_s`)."""

    @rpc
    def JoinCluster(
        self, request: pb.JoinClusterRequest, context: grpc.ServicerContext
    ) -> pb.JoinClusterResponse:
        if self.ca is None or self.identities is None:
            raise FailedPrecondition(
                "this orchestrator issues no node certificates (start it with --tls-ca-key and "
                "--join-service-account); give the node its certificate with --tls-cert instead"
            )
        wait = self.throttle.admit(_address(context.peer()))
        if wait:
            raise TemporaryError(f"too many join requests; ask again in {wait:.1f} s", delay=wait)
        node = required("node", request.node)
        required("token", request.token)
        if not request.csr_pem:
            raise InvalidArgument("csr_pem", "is required")
        try:
            key = pki.requested_key(request.csr_pem)
        except ValueError as exc:
            raise InvalidArgument("csr_pem", str(exc)) from None
        where = self.identities.node_of(request.token)
        if where != node:
            raise PermissionDenied(f"node: the token's pod runs on node {where!r}, not {node!r}")
        cert = pki.issue(self.ca, key, node_identity(node), lifetime=self.lifetime)
        log.info("node %s joined the cluster; its certificate expires %s", node, cert.not_valid_after_utc)
        return pb.JoinClusterResponse(certificate_pem=pki.pem(cert), ca_pem=pki.pem(self.ca[0]))
