"""Settings of the control loop, built once at start-up from flags, environment and config file."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControlSettings:
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
    """Consecutive failed starts or restores before an episode fails for good; for a GRPO group's
    member, consecutive failed restores before it starts over from the beginning instead."""
    group_max_attempts: int = 20
    """Consecutive failed starts before a GRPO group's member fails for good. Higher than
    max_attempts, as a member that fails takes its whole group with it: with the backoff capped at
    64 times retry_backoff_s (128 s), the default keeps trying for about half an hour."""
    retry_backoff_s: float = 2.0
    """First wait after a failed start or restore; doubles with every further failure, and is
    never shorter than the delay an unreachable agent asked for."""
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
