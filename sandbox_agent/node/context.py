"""What every operation of one node shares: its settings, runtime, sandboxes, disk and store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.images import oci
from sandbox_agent.images.cache import ImageCache
from sandbox_agent.node.disk import DiskBudget
from sandbox_agent.node.sandboxes import Sandboxes
from sandbox_agent.phases import PhaseHooks
from sandbox_agent.runtime.backend import Backend
from sandbox_agent.settings import AgentSettings
from snapshots import SnapshotStore


@dataclass(frozen=True)
class NodeContext:
    """One node's shared parts, made once at start-up; the operations receive it."""

    name: str
    settings: AgentSettings
    backend: Backend
    sandboxes: Sandboxes
    disk: DiskBudget
    images: ImageCache
    registry: oci.RegistryAccess
    store: SnapshotStore | None
    hooks: PhaseHooks
    """Called around every checkpoint and restore phase."""
    criu_version: str
    userns_base: int
    """Where new sandboxes' ids start on the host; 0 where the backend has no user namespaces."""
    staging: Path
    """Where a checkpoint or a restore's files are staged on disk."""
    memory_staging: Path | None
    """Where a restore's files may be staged in memory (`staging.staging_for`)."""

    def require_store(self) -> SnapshotStore:
        if self.store is None:
            raise FailedPrecondition(f"node {self.name} has no snapshot store configured (--snapshot-store)")
        return self.store
