"""Joining the cluster: a node without a certificate proves which node it is and gets one.

Its key is made here and never leaves the node; a signing request for its name, with its proof
(its pod's Kubernetes service-account token), goes to the orchestrator's public port, and the
certificate comes back (`orchestrator.api.join`). A certificate still current is kept.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from protos import pki
from protos.stasis.v1 import stasis_pb2 as spb
from protos.stasis.v1 import stasis_pb2_grpc as spb_grpc
from protos.tls import ORCHESTRATOR, TlsFiles, anonymous_channel, node_identity
from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.settings import JoinSettings

log = logging.getLogger(__name__)

JOIN_PATIENCE_S = 300.0
"""How long an agent keeps asking an orchestrator that does not answer (it may be starting too)."""


def _unanswered(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def joined(node: str, root: Path, join: JoinSettings) -> TlsFiles:
    """This node's certificate files under <root>/tls, joining the cluster first unless they hold
    a current certificate for it. Raises FailedPrecondition if the orchestrator refuses."""
    files = TlsFiles(join.ca, root / "tls" / "node.crt", root / "tls" / "node.key")
    identity = node_identity(node)
    address = join.address
    try:
        ca_pem = join.ca.read_bytes()
        token = join.token_file.read_text().strip()
    except OSError as exc:
        raise FailedPrecondition(f"cannot join the cluster: {exc}") from None
    if (
        files.cert.exists()
        and files.key.exists()
        and pki.current(files.cert.read_bytes(), ca_pem, {identity})
    ):
        return files
    key = pki.new_key()
    request = spb.JoinClusterRequest(node=node, csr_pem=pki.request(key, identity), token=token)

    @retry(
        retry=retry_if_exception(_unanswered),
        wait=wait_exponential(multiplier=0.5, max=10),
        stop=stop_after_delay(JOIN_PATIENCE_S),
        reraise=True,
    )
    def ask() -> spb.JoinClusterResponse:
        with anonymous_channel(address, join.ca, ORCHESTRATOR) as channel:
            return spb_grpc.ClusterJoinStub(channel).JoinCluster(request, timeout=30)

    try:
        reply = ask()
    except grpc.RpcError as exc:
        raise FailedPrecondition(
            f"the orchestrator at {address} did not let node {node} join: {exc.code().name}: {exc.details()}"
        ) from None
    pki.write_key(files.key, key)
    files.cert.write_bytes(reply.certificate_pem)
    log.info("node %s joined the cluster at %s", node, address)
    return files
