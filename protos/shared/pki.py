"""Certificates of the cluster CA: the keys, requests and signatures behind `protos.shared.tls`.

One CA signs every party's certificate. Its common name (and only DNS name) says who holds it:
`ORCHESTRATOR`, or `node_identity(name)` for a node. The local stack keeps the CA in files
(`orchestrator.cli.pki`); in a cluster the orchestrator holds the CA's key and signs the request
of each node that proves which node it is (`NodeRegistry.JoinCluster`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_LIFETIME = datetime.timedelta(days=397)
"""The orchestrator's own certificate: a year and a month, the longest a browser would take. It
is issued again at a start once it is `due`; its key lives beside the CA's, which outweighs it."""
BACKDATE = datetime.timedelta(minutes=5)
"""How long before its issue a certificate is valid from, for a holder whose clock is a little
behind ours; at most a quarter of a short-lived certificate's life."""

CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
"""A CA's key: ours are elliptic-curve; Helm's genCA (the chart) makes RSA ones."""

_CA_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key readable by its owner alone, in place of any before it at once."""
    write(path, key_pem(key))


def write(path: Path, content: bytes) -> None:
    """Replace a file at once, readable by its owner alone: a reader sees the old one or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    os.replace(staged, path)


def load_ca(cert_pem: bytes, key_pem_bytes: bytes) -> tuple[x509.Certificate, CaKey]:
    """The CA's certificate and key; ValueError if they are unreadable or not a pair."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem_bytes, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"the CA key is a {type(key).__name__}; an EC or RSA key is needed")
    if key.public_key() != cert.public_key():
        raise ValueError("the CA key does not belong to the CA certificate")
    return cert, key


def new_ca(common_name: str = "stasis cluster CA") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca: tuple[x509.Certificate, CaKey],
    public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
    common_name: str,
    hosts: tuple[str, ...] = (),
    lifetime: datetime.timedelta = LEAF_LIFETIME,
) -> x509.Certificate:
    """A certificate from the CA for `common_name` (also its first DNS name), serving and dialling,
    valid for `lifetime` from now."""
    ca_cert, ca_key = ca
    alt: list[x509.GeneralName] = []
    for host in sorted({common_name, *hosts}):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        _builder(subject, ca_cert.subject, public_key, lifetime)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def request(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    """A signing request (PEM) for `common_name`: what a node sends to join the cluster."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def requested_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
    """The public key of a signing request whose signature holds; ValueError otherwise."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate signing request: {exc}") from None
    if not csr.is_signature_valid:
        raise ValueError("the signing request's signature does not hold")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise ValueError(f"the signing request holds a {type(key).__name__}; an EC or RSA key is needed")
    return key


def current(cert_pem: bytes, ca_pem: bytes, names: set[str]) -> bool:
    """Whether a certificate is the CA's, names exactly `names`, and is not yet `due`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    held = {str(n) for n in alt.get_values_for_type(x509.IPAddress)} | set(
        alt.get_values_for_type(x509.DNSName)
    )
    return held == names and datetime.datetime.now(datetime.UTC) < due(cert)


def due(cert: x509.Certificate) -> datetime.datetime:
    """When a certificate should be replaced: once two thirds of its life have passed, so that a
    third is left to get the next one in, through a failed attempt or an orchestrator restart."""
    return cert.not_valid_after_utc - (cert.not_valid_after_utc - cert.not_valid_before_utc) / 3


def pair(cert_pem: bytes, key_pem_bytes: bytes) -> bool:
    """Whether a private key belongs to a certificate (a certificate and key read while they were
    being replaced may not)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem_bytes, password=None)
    except (ValueError, TypeError):
        return False
    return cert.public_key() == key.public_key()


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
    lifetime: datetime.timedelta,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - min(BACKDATE, lifetime / 4))
        .not_valid_after(now + lifetime)
    )
