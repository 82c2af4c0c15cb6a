"""The control plane's record of a committed snapshot, and why a snapshot is taken (`Reason`,
the snapshot store's own words, which the control plane records as they are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapshots import Reason

__all__ = ["Reason", "SnapshotRecord"]


@dataclass(frozen=True)
class SnapshotRecord:
    id: str
    episode_id: str
    sequence: int
    parent_id: str
    node: str
    reason: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    trajectory_cursor: Any
    timings_ms: dict[str, float]
    manifest_digest: str = ""
    """"sha256:<hex>" of the snapshot's manifest as its node stored it: every restore carries it,
    and the node refuses a manifest that differs (replaced in the store since). Empty in records
    made before manifests were digested: such a snapshot is never restored."""
