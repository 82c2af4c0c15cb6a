"""Settings of one orchestrator process, built once at start-up from flags, environment and
config file: where it listens and keeps its state, plus the control loop's and the gateway's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.control import ControlSettings
from orchestrator.gateway import GatewaySettings
from protos.shared.tls import TlsFiles


@dataclass(frozen=True)
class AuthSettings:
    """Who may reach this orchestrator. Without them (`--insecure`) it trusts every caller."""

    tls: TlsFiles
    """The orchestrator's certificate from the cluster CA: it serves both ports and dials the nodes."""
    tokens_file: Path
    """Bearer tokens of the public API, with their roles (see `api.access`)."""
    cluster_listen: str = "0.0.0.0:7071"
    """Mutual-TLS address for the node registry: only nodes, each with its own certificate."""
    ca_key: Path | None = None
    """The cluster CA's key. With it (and `join_service_account`) nodes without a certificate
    get one here by proving which node they are (`api.join`); without it, each node is given
    its certificate by whoever runs it (`stasis up` does)."""
    join_service_account: str = ""
    """NAMESPACE:NAME of the agents' Kubernetes service account, whose pod tokens prove a node."""
    node_certificate_s: float = 24 * 3600.0
    """How long a certificate issued to a joining node lasts, in seconds; the node joins again
    for the next once two thirds have passed. Nothing revokes a certificate, so this bounds how
    long a copied node key can pass for that node: a day, where the node renews 16 hours in and
    has 8 left to outlast an orchestrator outage, while a join every 16 hours per node costs
    Kubernetes one TokenReview and one pod read."""


@dataclass(frozen=True)
class OrchestratorSettings:
    state_dir: Path
    """Holds the embedded SQLite state (state.db) and, by default, the local snapshot store."""
    database_url: str = field(default="", repr=False)
    """postgresql://USER:PASSWORD@HOST:PORT/DATABASE: keep episodes, events, nodes, images and
    the trajectory ledger there instead of in state.db. Empty keeps them in state.db, which
    needs no server. Left out of repr: it may hold a password."""
    listen: str = "127.0.0.1:7070"
    """gRPC address of the public API and the node registry."""
    health_listen: str = ""
    """Plaintext address serving gRPC health checking alone, for probes that cannot speak TLS
    (the kubelet's); empty = none. The API's own port serves health checking too."""
    snapshot_store: str = ""
    """Snapshot store URL shared with every agent; empty means file://<state_dir>/snapshots."""
    import_registry: str = ""
    """host:port of the registry `stasis image import` pushes local sources to; empty = none."""
    auth: AuthSettings | None = None
    control: ControlSettings = field(default_factory=ControlSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)

    @property
    def store_url(self) -> str:
        return self.snapshot_store or f"file://{self.state_dir / 'snapshots'}"
