"""The local stack's certificates: one cluster CA under <state>/pki, a certificate for the
orchestrator and one per node, each naming its holder (see `protos.shared.tls`). Made on the first
`stasis up` and reused after, so running sandboxes, agents and client configs stay valid; a
node's is issued again once it is `pki.due`, which the running stack checks every hour."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509

from protos.shared import pki
from protos.shared.tls import ORCHESTRATOR, TlsFiles, node_identity

NODE_LIFETIME = datetime.timedelta(days=7)
"""How long a node certificate issued here lasts. The stack issues the next after 4.7 days and its
agents take it up without a restart (`protos.shared.tls`); a copied key is good for a week at most,
where a node that joins a cluster holds one for a day (`AuthSettings.node_certificate_s`)."""


class ClusterPki:
    def __init__(self, root: Path, ca: tuple[Path, Path] | None = None) -> None:
        """Certificates under root, from the CA in root (made there if missing), or from `ca`, an
        existing CA's certificate and key (a cluster's, given to `stasis server`)."""
        self.root = root
        self.ca_cert, self.ca_key = ca or (root / "ca.crt", root / "ca.key")
        self._makes_ca = ca is None

    def orchestrator(self, hosts: tuple[str, ...] = ()) -> TlsFiles:
        """The orchestrator's certificate: it serves both ports and dials the nodes with it."""
        return self._leaf("orchestrator", ORCHESTRATOR, ("localhost", "127.0.0.1", *hosts))

    def node(self, name: str) -> TlsFiles:
        """Node `name`'s certificate, issued again if it is due."""
        return self._leaf(f"nodes/{name}", node_identity(name), (), NODE_LIFETIME)

    def _ca(self) -> tuple[x509.Certificate, pki.CaKey]:
        if self._makes_ca and not (self.ca_cert.exists() and self.ca_key.exists()):
            cert, key = pki.new_ca()
            pki.write_key(self.ca_key, key)
            self.ca_cert.write_bytes(pki.pem(cert))
        return pki.load_ca(self.ca_cert.read_bytes(), self.ca_key.read_bytes())

    def _leaf(
        self,
        stem: str,
        common_name: str,
        hosts: tuple[str, ...],
        lifetime: datetime.timedelta = pki.LEAF_LIFETIME,
    ) -> TlsFiles:
        files = TlsFiles(self.ca_cert, self.root / f"{stem}.crt", self.root / f"{stem}.key")
        ca = self._ca()
        held = files.key.exists() and files.cert.exists()
        if held and pki.current(files.cert.read_bytes(), pki.pem(ca[0]), {common_name, *hosts}):
            return files
        key = pki.new_key()
        cert = pki.issue(ca, key.public_key(), common_name, hosts, lifetime)
        # The key first: an agent reading between the two sees a pair that does not match, and reads again.
        pki.write_key(files.key, key)
        pki.write(files.cert, pki.pem(cert))
        return files
