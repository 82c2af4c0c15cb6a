"""Stasis snapshots: format, content-addressed chunk store, history, verification, GC and archives.

Depends on nothing else in Stasis. Everything importable from here is the
public API; the underscore modules are internal.
"""

from ._archive import export_checkpoint_archive, import_checkpoint_archive
from ._collector import collector_paused, set_aside_startup_objects
from ._deltas import Aligner, Alignment, Segment
from ._errors import (
    InvalidCheckpoint,
    InvalidSettings,
    InvalidSnapshotMeta,
    ManifestMismatch,
    SnapshotCorrupt,
    SnapshotError,
    SnapshotExists,
    SnapshotNotFound,
    StoreError,
    StoreLocked,
    StoreRejected,
    StoreUnavailable,
)
from ._gc import GcReport, RetentionPolicy
from ._history import SnapshotInfo
from ._manifest import (
    ChunkRef,
    ChunkTable,
    Entry,
    EntryKind,
    Manifest,
    Reason,
    SnapshotMeta,
    SnapshotSizes,
    manifest_digest,
)
from ._manifest_json import DELTA_FORMAT, FORMAT
from ._random import StoredFile
from ._reader import SnapshotReader
from ._settings import ChunkingSettings, LockSettings, RetrySettings, StoreSettings
from ._store import SnapshotStore
from ._verify import Problem, VerifyReport

__all__ = [
    "DELTA_FORMAT",
    "FORMAT",
    "Aligner",
    "Alignment",
    "ChunkRef",
    "ChunkTable",
    "ChunkingSettings",
    "Entry",
    "EntryKind",
    "GcReport",
    "InvalidCheckpoint",
    "InvalidSettings",
    "InvalidSnapshotMeta",
    "LockSettings",
    "Manifest",
    "ManifestMismatch",
    "Problem",
    "Reason",
    "RetentionPolicy",
    "RetrySettings",
    "Segment",
    "SnapshotCorrupt",
    "SnapshotError",
    "SnapshotExists",
    "SnapshotInfo",
    "SnapshotMeta",
    "SnapshotNotFound",
    "SnapshotReader",
    "SnapshotSizes",
    "SnapshotStore",
    "StoreError",
    "StoreLocked",
    "StoreRejected",
    "StoreSettings",
    "StoreUnavailable",
    "StoredFile",
    "VerifyReport",
    "collector_paused",
    "export_checkpoint_archive",
    "import_checkpoint_archive",
    "manifest_digest",
    "set_aside_startup_objects",
]
