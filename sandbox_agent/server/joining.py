"""Joining the cluster: a node without a certificate proves which node it is and gets one.

Its key is made here and never leaves the node; a signing request for its name, with its proof
(its pod's Kubernetes service-account token), goes to the orchestrator's public port, and the
certificate comes back (`orchestrator.api.join`). A certificate still current is kept.

A joined certificate is short-lived (a day, by default): `Renewal` joins again once two thirds
of its life have passed, and replaces the files, which the node's TLS server and its
registration pick up without a restart (`protos.shared.tls`).
"""

from __future__ import annotations

import datetime
import logging
import threading
from pathlib import Path

import grpc
from cryptography import x509
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from protos.shared import pki
from protos.shared.tls import ORCHESTRATOR, TlsFiles, anonymous_channel, node_identity
from protos.stasis.v1 import stasis_pb2 as spb
from protos.stasis.v1 import stasis_pb2_grpc as spb_grpc
from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.settings import JoinSettings

log = logging.getLogger(__name__)

JOIN_PATIENCE_S = 300.0
"""How long an agent keeps asking an orchestrator that does not answer (it may be starting too)."""
RENEW_RETRY_S = 60.0
"""How long a renewal that failed waits to try again, at most; less when the certificate has
less than ten times that left."""


def _unanswered(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def joined(node: str, root: Path, join: JoinSettings) -> TlsFiles:
    """This node's certificate files under <root>/tls, joining the cluster first unless they hold
    a current certificate for it. Raises FailedPrecondition if the orchestrator refuses."""
    files = TlsFiles(join.ca, root / "tls" / "node.crt", root / "tls" / "node.key")
    try:
        ca_pem = join.ca.read_bytes()
    except OSError as exc:
        raise FailedPrecondition(f"cannot join the cluster: {exc}") from None
    if (
        files.cert.exists()
        and files.key.exists()
        and pki.current(files.cert.read_bytes(), ca_pem, {node_identity(node)})
    ):
        return files
    _join(node, files, join)
    return files


def _join(node: str, files: TlsFiles, join: JoinSettings) -> None:
    """Ask the orchestrator for a certificate for a new key, and put both in `files`."""
    address = join.address
    try:
        token = join.token_file.read_text().strip()  # projected tokens are rotated: read it anew
    except OSError as exc:
        raise FailedPrecondition(f"cannot join the cluster: {exc}") from None
    key = pki.new_key()
    request = spb.JoinClusterRequest(node=node, csr_pem=pki.request(key, node_identity(node)), token=token)

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
    # The key first: a reader between the two sees a pair that does not match, and reads again.
    pki.write_key(files.key, key)
    pki.write(files.cert, reply.certificate_pem)
    expires = x509.load_pem_x509_certificate(reply.certificate_pem).not_valid_after_utc
    log.info("node %s joined the cluster at %s; its certificate expires %s", node, address, expires)


class Renewal:
    """A thread that joins the cluster again for this node's next certificate once two thirds
    of the current one's life have passed, and again after a failure until it expires."""

    def __init__(self, node: str, files: TlsFiles, join: JoinSettings) -> None:
        self.node, self.files, self.join = node, files, join
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renewal-{node}", daemon=True)

    def start(self) -> Renewal:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cert: x509.Certificate | None = x509.load_pem_x509_certificate(self.files.cert.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("node %s cannot read its certificate, so joins again: %s", self.node, exc)
                cert = None
            if cert is not None:
                now = datetime.datetime.now(datetime.UTC)
                if self._stop.wait(max(0.0, (pki.due(cert) - now).total_seconds())):
                    return
            try:
                _join(self.node, self.files, self.join)
            except Exception as exc:
                now = datetime.datetime.now(datetime.UTC)
                left = (cert.not_valid_after_utc - now).total_seconds() if cert is not None else 0.0
                log.warning("node %s could not renew its certificate (%.0f s left): %s", self.node, left, exc)
                self._stop.wait(min(RENEW_RETRY_S, max(left / 10, 1.0)))
