"""Nodes as the control plane knows them."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NodeState(enum.StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    LOST = "LOST"


@dataclass
class NodeRecord:
    name: str
    address: str
    state: NodeState
    backend: str
    slots: int
    memory_mb: int
    images: dict[str, list[str]]
    """digest -> names"""
    labels: dict[str, str]
    registered_at: float
    last_heartbeat: float = 0.0
    disk_mb: int = 0
    """Disk the node offers sandboxes (their layers and a checkpoint's staging); 0 if it does
    not say (an agent from before it counted), and then disk does not limit placement."""
    restores_forks: bool = False
    """Whether it restores a snapshot as another sandbox, a fork child (its agent says so)."""

    def has_image(self, ref: str) -> bool:
        return ref in self.images or any(ref in names for names in self.images.values())
