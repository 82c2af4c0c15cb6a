"""The local stack's certificates: one cluster CA under <state>/pki, a certificate for the
orchestrator and one per node, each naming its holder (see `protos.tls`). Made on the first
`stasis up` and reused after, so running sandboxes, agents and client configs stay valid."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from protos.tls import ORCHESTRATOR, TlsFiles, node_identity

CA_DAYS = 3650
LEAF_DAYS = 397
"""Leaf certificates are renewed by the next `stasis up` once less than RENEW_DAYS remain."""
RENEW_DAYS = 30
_CA_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip


class ClusterPki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca_cert = root / "ca.crt"
        self._ca_key = root / "ca.key"

    def orchestrator(self, hosts: tuple[str, ...] = ()) -> TlsFiles:
        """The orchestrator's certificate: it serves both ports and dials the nodes with it."""
        return self._leaf("orchestrator", ORCHESTRATOR, ("localhost", "127.0.0.1", *hosts))

    def node(self, name: str) -> TlsFiles:
        return self._leaf(f"nodes/{name}", node_identity(name), ())

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if not (self.ca_cert.exists() and self._ca_key.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stasis cluster CA")])
            cert = (
                _builder(name, name, key.public_key(), CA_DAYS)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(_CA_USAGE, critical=True)
                .sign(key, hashes.SHA256())
            )
            _write_key(self._ca_key, key)
            self.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        loaded = serialization.load_pem_private_key(self._ca_key.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        return cert, loaded

    def _current(self, path: Path, names: set[str]) -> bool:
        """Whether the certificate at path is the CA's, names exactly `names`, and is not about to expire."""
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(self.ca_cert.read_bytes()))
        except (OSError, ValueError, TypeError, InvalidSignature):
            return False
        left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        held = {str(n) for n in alt.get_values_for_type(x509.IPAddress)} | set(
            alt.get_values_for_type(x509.DNSName)
        )
        return held == names and left > datetime.timedelta(days=RENEW_DAYS)

    def _leaf(self, stem: str, common_name: str, hosts: tuple[str, ...]) -> TlsFiles:
        files = TlsFiles(self.ca_cert, self.root / f"{stem}.crt", self.root / f"{stem}.key")
        names = {common_name, *hosts}
        if files.key.exists() and self._current(files.cert, names):
            return files
        ca_cert, ca_key = self._ca()
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        alt: list[x509.GeneralName] = []
        for host in sorted(names):
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        cert = (
            _builder(subject, ca_cert.subject, key.public_key(), LEAF_DAYS)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        files.cert.parent.mkdir(parents=True, exist_ok=True)
        _write_key(files.key, key)
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return files


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
