"""Error families of the snapshots package; every failure it raises is a SnapshotError."""

from __future__ import annotations


class SnapshotError(Exception):
    """Root of every error raised by the snapshots package."""


class SnapshotNotFound(SnapshotError):
    """No committed snapshot has this id."""

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id!r} not found")
        self.snapshot_id = snapshot_id


class SnapshotExists(SnapshotError):
    """A snapshot with this id is already committed; snapshots are immutable."""

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id!r} already exists and snapshots are immutable")
        self.snapshot_id = snapshot_id


class SnapshotCorrupt(SnapshotError):
    """Stored snapshot content does not match its manifest.

    ``path`` is the file inside the snapshot (``None`` when the manifest itself
    is unreadable) and ``chunk`` the hash of the chunk that failed.
    """

    def __init__(self, snapshot_id: str, path: str | None, chunk: str | None, detail: str) -> None:
        where = f"snapshot {snapshot_id!r}"
        if path is not None:
            where += f", file {path!r}"
        if chunk is not None:
            where += f", chunk {chunk}"
        super().__init__(f"{where}: {detail}")
        self.snapshot_id = snapshot_id
        self.path = path
        self.chunk = chunk
        self.detail = detail


class ManifestMismatch(SnapshotCorrupt):
    """The store holds a manifest other than the one recorded for this snapshot: it was replaced
    (by anyone with write access to the store) or damaged since. Raised before a byte of it is
    parsed, so nothing it names is read."""

    def __init__(self, snapshot_id: str, expected: str, found: str) -> None:
        super().__init__(
            snapshot_id,
            None,
            None,
            f"the store's manifest is {found}, not the {expected} recorded when the snapshot was "
            "taken: it was replaced or damaged since, and nothing of it is read",
        )
        self.expected = expected
        self.found = found


class InvalidSnapshotMeta(SnapshotError):
    """Snapshot metadata was rejected before anything was written; ``field`` names the culprit."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"invalid snapshot metadata field {field!r}: {detail}")
        self.field = field
        self.detail = detail


class InvalidSettings(SnapshotError):
    """A settings dataclass or store URL is unusable; ``field`` names the culprit."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"invalid store setting {field!r}: {detail}")
        self.field = field
        self.detail = detail


class InvalidCheckpoint(SnapshotError):
    """A checkpoint directory or checkpoint archive cannot be stored or converted."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class StoreError(SnapshotError):
    """The backing store failed; ``key`` is the object involved, when there is one."""

    def __init__(self, store: str, key: str | None, detail: str) -> None:
        where = f"store {store}" + (f", key {key!r}" if key is not None else "")
        super().__init__(f"{where}: {detail}")
        self.store = store
        self.key = key
        self.detail = detail


class StoreUnavailable(StoreError):
    """A transient store failure persisted through every retry; trying again later may work."""


class StoreRejected(StoreError):
    """The store refused the request permanently (credentials, missing bucket, bad request)."""


class StoreLocked(SnapshotError):
    """The store lock could not be taken or was lost, so the operation did not run or was abandoned."""

    def __init__(self, detail: str, holders: tuple[str, ...] = ()) -> None:
        suffix = f" (held by {', '.join(holders)})" if holders else ""
        super().__init__(detail + suffix)
        self.detail = detail
        self.holders = holders
