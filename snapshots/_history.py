"""Per-episode snapshot history: order, lineage and space accounting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._manifest import Manifest, Reason, SnapshotSizes


@dataclass(frozen=True)
class SnapshotInfo:
    """One committed snapshot as shown in an episode's history."""

    snapshot_id: str
    episode_id: str
    seq: int
    parent_id: str | None
    node: str
    reason: Reason
    created_at: datetime
    trajectory_cursor: Any
    sizes: SnapshotSizes
    lineage: tuple[str, ...]
    """Ancestor ids, parent first. Ends at the root, or at the first ancestor no longer stored."""
    lineage_complete: bool
    """False when an ancestor was deleted (retention), so the chain is cut short."""

    @property
    def stored_bytes(self) -> int:
        """Compressed size of the distinct chunks this snapshot references."""
        return self.sizes.stored_bytes

    @property
    def new_bytes(self) -> int:
        """Compressed bytes this snapshot added to the store."""
        return self.sizes.new_bytes

    @property
    def dedup_ratio(self) -> float:
        """Logical bytes over stored bytes."""
        return self.sizes.dedup_ratio


def build(manifests: Sequence[Manifest]) -> list[SnapshotInfo]:
    """History rows for manifests of one episode, ordered by seq then creation time."""
    by_id = {m.snapshot_id: m for m in manifests}
    rows = []
    for m in sorted(manifests, key=lambda m: (m.seq, m.created_at, m.snapshot_id)):
        chain: list[str] = []
        complete = True
        parent = m.parent_id
        while parent is not None and parent not in chain:
            chain.append(parent)
            if parent not in by_id:
                complete = False
                break
            parent = by_id[parent].parent_id
        rows.append(
            SnapshotInfo(
                snapshot_id=m.snapshot_id,
                episode_id=m.episode_id,
                seq=m.seq,
                parent_id=m.parent_id,
                node=m.node,
                reason=m.reason,
                created_at=m.created_at,
                trajectory_cursor=m.trajectory_cursor,
                sizes=m.sizes,
                lineage=tuple(chain),
                lineage_complete=complete,
            )
        )
    return rows
