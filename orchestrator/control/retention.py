"""Snapshot retention: keep the last N snapshots of live episodes, their resume points and the
snapshots before them to fall back to, and the snapshots being taken; drop an ended episode's
snapshots after a grace period for inspection and export."""

from __future__ import annotations

import logging
import time

from orchestrator.control.settings import ControlSettings
from orchestrator.state import StateStore
from snapshots import GcReport, RetentionPolicy, SnapshotError, SnapshotStore

log = logging.getLogger(__name__)


def collect_snapshots(
    settings: ControlSettings, store: StateStore, snapshots: SnapshotStore
) -> GcReport | None:
    """One retention pass; None if the snapshot store could not run it (it runs again later)."""
    ended = store.episodes.ended_before(time.time() - settings.gc_grace_s)
    resume_points, pending = store.snapshots.anchors()
    try:
        report = snapshots.gc(
            RetentionPolicy(keep_last=settings.gc_keep_last),
            ended_episodes=ended,
            resume_points=resume_points,
            pending=pending,
        )
    except SnapshotError as exc:
        log.warning("snapshot gc failed: %s", exc)
        return None
    log.info("snapshot gc: %s", report)
    return report
