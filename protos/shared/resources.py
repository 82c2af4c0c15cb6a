"""The bounds of a sandbox's resource limits: one check, made by the orchestrator when an episode
is submitted and by the node agent when a sandbox is made (which anyone with a node's API may ask
for), each naming the field in its own error."""

from __future__ import annotations

from typing import Any

BOUNDS: dict[str, tuple[float, float]] = {
    "cpus": (0, 256),
    "memory_mb": (16, 1 << 20),
    "pids": (8, 1 << 22),
    "disk_mb": (16, 1 << 24),
    "inodes": (1024, 1 << 28),
}
"""Lowest and highest value of each limit, in its field's unit (cores, MiB, processes, MiB,
files); a CPU quota must be above its lowest, the others may equal it."""


def resource_problem(resources: Any) -> tuple[str, str] | None:
    """`(field, what is wrong)` for the first limit of `resources` out of its bounds, or None.
    A record without one of the fields (the orchestrator's has no pids or inodes) is not checked
    on it."""
    for name, (low, high) in BOUNDS.items():
        if not hasattr(resources, name):
            continue
        value = getattr(resources, name)
        if name == "cpus":
            if not low < value <= high:
                return name, f"{value} must be > {low} and <= {high}"
        elif not low <= value <= high:
            return name, f"{value} must be between {low} and {high}"
    return None
