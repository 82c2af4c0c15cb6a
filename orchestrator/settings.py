"""Settings of the control plane, built once at start-up from flags, environment and config file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OrchestratorSettings:
    state_dir: Path
    """Holds the embedded SQLite state (state.db) and, by default, the local snapshot store."""
    listen: str = "127.0.0.1:7070"
    """gRPC address of the public API and the node registry."""
    snapshot_store: str = ""
    """Snapshot store URL shared with every agent; empty means file://<state_dir>/snapshots."""
    address_pool: str = "10.200.0.0/16"
    """Sandbox addresses; each live episode keeps one address across all its nodes."""
    node_lost_after_s: float = 10.0
    """A node silent this long is lost and its episodes go back to their last snapshot.
    Ten missed 1 s heartbeats: long enough for a busy agent, short for a dead spot node."""
    heartbeat_interval_s: float = 1.0
    """Told to agents when they register."""
    tick_s: float = 0.5
    """Period of the control loop; events (heartbeats, requests, finished work) wake it sooner."""
    workers: int = 16
    """Agent calls (create, checkpoint, restore) run at once; each can take seconds."""
    max_attempts: int = 5
    """Consecutive failed starts or restores before an episode fails for good."""
    retry_backoff_s: float = 2.0
    """First wait after a failed start or restore; doubles with every further failure."""
    gc_interval_s: float = 60.0
    """How often snapshot retention runs."""
    gc_keep_last: int = 3
    """Snapshots kept per live episode; older ones are collected. The latest is always kept."""
    gc_grace_s: float = 600.0
    """An ended episode's snapshots stay this long for inspection and export before collection."""
    default_time_slice_s: float = 0.0
    """Time slice for episodes whose spec gives none (0); 0 here too means no time-slicing."""
    default_priority: int = 0
    """Priority for episodes whose spec gives none (0)."""
    kube_watch: bool = False
    """Watch Kubernetes nodes and drain the Stasis node of a node being reclaimed (in a cluster)."""
    gateway_port: int = 8080
    """Port of the inference gateway as sandboxes see it, on 169.254.1.1."""
    gateway_listen: str = ""
    """Where the gateway listens; empty means no gateway (sandboxes get no model endpoint)."""
    upstream: str = ""
    """OpenAI-compatible model server the gateway forwards to, up to and including /v1."""
    upstream_api_key: str = ""
    """Bearer token for the upstream, if it wants one; sandboxes never see it."""

    @property
    def store_url(self) -> str:
        return self.snapshot_store or f"file://{self.state_dir / 'snapshots'}"
