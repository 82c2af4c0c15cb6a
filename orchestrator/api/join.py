"""Nodes joining the cluster: a node that proves which node it is gets a certificate naming it.

The proof is its agent pod's service-account token (`control.kube.NodeIdentities`): Kubernetes
says which pod holds it, and that pod says which node it runs on. The certificate is signed by
the cluster CA, whose key only the orchestrator holds, and names that node alone; with it the
node registers, heartbeats and serves its sandboxes (`protos.tls`).
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc
from cryptography import x509

from orchestrator.api.status import required, rpc
from orchestrator.domain import FailedPrecondition, InvalidArgument, PermissionDenied
from protos import pki
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from protos.tls import node_identity

log = logging.getLogger(__name__)


class Identities(Protocol):
    def node_of(self, token: str) -> str:
        """The node the holder of `token` runs on; raises if the token proves nothing."""


class JoinService(pb_grpc.ClusterJoinServicer):
    def __init__(self, ca: tuple[x509.Certificate, pki.CaKey] | None, identities: Identities | None) -> None:
        self.ca = ca
        self.identities = identities

    @rpc
    def JoinCluster(
        self, request: pb.JoinClusterRequest, context: grpc.ServicerContext
    ) -> pb.JoinClusterResponse:
        if self.ca is None or self.identities is None:
            raise FailedPrecondition(
                "this orchestrator issues no node certificates (start it with --tls-ca-key and "
                "--join-service-account); give the node its certificate with --tls-cert instead"
            )
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
        cert = pki.issue(self.ca, key, node_identity(node))
        log.info("node %s joined the cluster; its certificate expires %s", node, cert.not_valid_after_utc)
        return pb.JoinClusterResponse(certificate_pem=pki.pem(cert), ca_pem=pki.pem(self.ca[0]))
