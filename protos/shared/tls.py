"""TLS between the orchestrator and its nodes: one cluster CA, and a certificate for each party
whose common name says who it is (`ORCHESTRATOR`, or `node_identity(name)` for a node). gRPC
takes it as credentials; the gateway and the nodes' relays to it as `ssl` contexts.

The orchestrator dials a node expecting that node's name, and a node may speak for no node but
the one its certificate names, so a node's name is bound to its certificate in both directions.

Certificate files may be replaced while they are in use (a node renews its own through
`ClusterJoin`; an operator's tooling may rotate theirs): a server presents the new one from its
next handshake on, and a dialler that sees `TlsFiles.stamp` change dials again.
"""

from __future__ import annotations

import datetime
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from protos.shared import pki

ORCHESTRATOR = "stasis-orchestrator"
"""Common name (and DNS name) of the orchestrator's certificate."""
NODE_SUFFIX = ".node.stasis"


def node_identity(name: str) -> str:
    """Common name (and DNS name) of node `name`'s certificate."""
    return f"{name}{NODE_SUFFIX}"


def node_of(identity: str) -> str:
    """The node a certificate's common name speaks for; empty if it names no node."""
    return identity.removesuffix(NODE_SUFFIX) if identity.endswith(NODE_SUFFIX) else ""


READ_TRIES = 20
"""How often a certificate and key that do not belong together are read again, 50 ms apart."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one party: the cluster CA's certificate, its own certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def _read(self) -> tuple[bytes, bytes, bytes]:
        """The CA certificate, certificate and key; read again while the key does not belong to
        the certificate, as when they are read between the replacement of one and the other."""
        for _ in range(READ_TRIES):
            parts = []
            for what, path in (("CA certificate", self.ca), ("certificate", self.cert), ("key", self.key)):
                try:
                    parts.append(path.read_bytes())
                except OSError as exc:
                    raise ValueError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None
            if pki.pair(parts[1], parts[2]):
                break
            time.sleep(0.05)
        return parts[0], parts[1], parts[2]

    def stamp(self) -> tuple[tuple[int, int], ...]:
        """What changes when any of the files is replaced or rewritten (inode and mtime)."""
        stamps = []
        for path in (self.ca, self.cert, self.key):
            try:
                st = path.stat()
            except OSError:
                stamps.append((0, 0))
            else:
                stamps.append((st.st_ino, st.st_mtime_ns))
        return tuple(stamps)

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """Serve with this certificate, read again for the next handshake whenever the files
        change; with require_client_cert, a caller must present a certificate from the cluster CA
        or the handshake fails."""
        ca, cert, key = self._read()
        served = [self.stamp()]

        def renewed() -> grpc.ServerCertificateConfiguration | None:
            # gRPC asks before every handshake: a stat unless the files changed.
            stamp = self.stamp()
            if stamp == served[0]:
                return None
            try:
                ca, cert, key = self._read()
            except ValueError:
                return None
            if not pki.pair(cert, key):
                return None  # caught mid-replacement: asked again at the next handshake
            served[0] = stamp
            return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

        return grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca),
            renewed,
            require_client_authentication=require_client_cert,
        )

    def channel(self, address: str, server: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to `address` that presents this certificate and accepts only a server whose
        certificate, from the cluster CA, names `server`."""
        ca, cert, key = self._read()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
        return grpc.secure_channel(
            address, credentials, [*options, ("grpc.ssl_target_name_override", server)]
        )

    def server_context(self) -> ssl.SSLContext:
        """TLS (outside gRPC) served with this certificate: a caller must present a certificate
        from the cluster CA or the handshake fails. ValueError names an unreadable file."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        self._load(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        """TLS (outside gRPC) that presents this certificate and accepts a server only with a
        certificate from the cluster CA naming the host dialled as (`server_hostname`)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        ca, _, _ = self._read()  # names an unreadable file
        try:
            context.load_verify_locations(cadata=ca.decode())
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"cannot use the TLS certificate {self.cert} and key {self.key}: {exc}"
            ) from None


def certified_identity(peercert: dict[str, Any] | None) -> str:
    """The common name of a verified certificate as `ssl` gives it (`getpeercert()`); empty
    without one, or once it has expired: the handshake checked it, but a connection kept alive
    may outlive it."""
    not_after = (peercert or {}).get("notAfter")
    if not_after and ssl.cert_time_to_seconds(not_after) <= time.time():
        return ""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def anonymous_channel(address: str, ca: Path, server: str) -> grpc.Channel:
    """A channel for a caller with no certificate yet (a node about to join): it still accepts
    only a server whose certificate, from the cluster CA, names `server`."""
    try:
        root = ca.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the TLS CA certificate {ca}: {exc.strerror}") from None
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.secure_channel(address, credentials, [("grpc.ssl_target_name_override", server)])


def peer_expiry(context: grpc.ServicerContext) -> datetime.datetime | None:
    """When the caller's verified certificate expires; None without one. The handshake checked
    it was valid then, but a connection may outlive it."""
    pems = context.auth_context().get("x509_pem_cert") or []
    return x509.load_pem_x509_certificate(pems[0]).not_valid_after_utc if pems else None


def peer_identity(context: grpc.ServicerContext) -> str:
    """The common name of the caller's verified certificate; empty without one."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode() if names else ""


def bind(server: grpc.Server, address: str, tls: TlsFiles | None, *, require_client_cert: bool) -> int:
    """Add a port to `server`: TLS with `tls`, plaintext without. Returns the bound port; raises
    ValueError naming the address or the unreadable file when it cannot."""
    try:
        port = (
            server.add_secure_port(address, tls.server_credentials(require_client_cert=require_client_cert))
            if tls
            else server.add_insecure_port(address)
        )
    except RuntimeError:
        port = 0
    if port == 0:
        raise ValueError(f"cannot listen on {address}")
    return port
