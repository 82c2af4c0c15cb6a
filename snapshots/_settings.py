"""Settings of the snapshot store, one dataclass per concern, built once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ._errors import InvalidSettings

KiB = 1024
MiB = 1024 * KiB
MAX_CHUNK = 1024 * MiB
"""The largest chunk any manifest may list: the max_size that FastCDC 2016 allowed, which earlier
releases cut with (FastCDC 2020 stops at 16 MiB)."""


@dataclass(frozen=True)
class ChunkingSettings:
    """How files are cut into content-defined chunks and compressed.

    Changing any of these keeps old snapshots readable (the manifest records
    every chunk) but stops new chunks from deduplicating against old ones.
    """

    min_size: int = 16 * KiB
    """Smallest chunk in bytes. Four 4 KiB pages: CRIU page images are page-aligned,
    so no real change is smaller than a page, and cutting finer only adds objects."""

    avg_size: int = 64 * KiB
    """Target mean chunk in bytes (16 pages). A dirtied page costs about this much
    upload; 64 KiB keeps a 1 GiB image at ~16k chunks (a ~1.5 MB manifest, ~16k S3
    PUTs on first upload) and is casync's default for the same trade-off."""

    max_size: int = 256 * KiB
    """Largest chunk in bytes (64 pages). Long zero or repeated runs, which never hit
    a cut point, become identical 256 KiB chunks that deduplicate to one object."""

    compression_level: int = 3
    """zstd level per chunk. 3 is zstd's default: memory pages are mostly
    incompressible or highly repetitive, and higher levels cost CPU on the
    checkpoint's critical path for a few percent of size."""

    def __post_init__(self) -> None:
        low, mid, high = self.min_size, self.avg_size - self.min_size, self.max_size
        if not 64 <= low <= mid <= high:
            raise InvalidSettings("chunking", "need 64 <= min_size <= avg_size - min_size <= max_size")
        if not (low <= 1 * MiB and 256 <= mid <= 4 * MiB and 1 * KiB <= high <= 16 * MiB):
            raise InvalidSettings(
                "chunking",
                "FastCDC takes min_size up to 1 MiB, avg_size - min_size from 256 bytes to 4 MiB "
                "and max_size from 1 KiB to 16 MiB",
            )
        if not 1 <= self.compression_level <= 22:
            raise InvalidSettings("chunking", "compression_level must be within 1..22")


@dataclass(frozen=True)
class RetrySettings:
    """Retries of transient backend failures (connection errors, 5xx, throttling)."""

    attempts: int = 6
    """Total tries per request, first included. Six exponential waits span
    roughly 10 s, enough to ride out an S3 SlowDown burst or a gateway restart."""

    initial_backoff_s: float = 0.2
    """First wait in seconds; doubles each retry, with jitter so that parallel
    chunk uploads do not retry in lockstep."""

    max_backoff_s: float = 5.0
    """Cap of one wait in seconds, so a long outage fails within a bounded time
    and surfaces as StoreUnavailable instead of hanging a checkpoint."""


@dataclass(frozen=True)
class LockSettings:
    """Timing of the store locks that keep garbage collection away from live writers."""

    stale_after_s: float = 600.0
    """Seconds after its last refresh, by the store's clock, at which another node may ignore
    a lock. Must exceed refresh_interval_s plus the longest a refresh may take to land (the
    nodes' own clocks do not enter: see docs/snapshot-format.md); 10 minutes also bounds how
    long a crashed writer on another node blocks GC (a lock of a dead process on the same host
    is ignored at once)."""

    refresh_interval_s: float = 60.0
    """Seconds between lock refreshes while an operation runs. A tenth of
    stale_after_s, so several refreshes may fail before the lock goes stale."""

    acquire_timeout_s: float = 300.0
    """Seconds a writer or reader waits for a running GC sweep before giving up
    with StoreLocked. A sweep deletes only unreferenced chunks and is short."""

    gc_acquire_timeout_s: float = 30.0
    """Seconds GC keeps trying for its exclusive lock. GC is periodic, so when
    writers are busy it is cheaper to skip this round than to stall them."""


@dataclass(frozen=True)
class StoreSettings:
    """Where the store lives and how it moves bytes.

    ``url`` is ``file:///abs/path`` (or a plain path) for a local or shared
    directory, or ``s3://bucket/prefix?endpoint=http://host:port&region=r``
    for an S3-compatible service (credentials come from the usual AWS
    environment variables or config files).
    """

    url: str
    """Location of the store, see the class docstring."""

    chunking: ChunkingSettings = field(default_factory=ChunkingSettings)
    """Chunk sizes and compression."""

    retry: RetrySettings = field(default_factory=RetrySettings)
    """Retry policy for transient S3 failures."""

    locks: LockSettings = field(default_factory=LockSettings)
    """Lock timing for the GC protocol."""

    io_threads: int | None = None
    """Worker threads for hashing, compressing and moving chunks; None picks by backend: one
    per core for a local directory, where the work is CPU (sha256 and zstd release the GIL;
    more threads than cores only contend for it), and 16 for S3, where each range read
    waits ~10 ms on the network and 16 in flight keep a restore streaming."""

    pack_bytes: int = 256 * MiB
    """Chunks are written into packs of about this many stored bytes (the last one of a put is
    smaller): one object per few hundred megabytes, where one per chunk would cost a file or a
    PUT per 64 KiB. GC removes a pack once no snapshot refers to any chunk in it."""

    durable: bool = True
    """Local backend: fsync every object as it is committed (a pack, its index, a marker) and
    their directories before publishing a manifest, then the manifest itself. Turn off only
    for throwaway stores; S3 PUTs are durable when acknowledged."""

    s3_timeout_s: float = 30.0
    """Connect and read timeout of one S3 request in seconds; a hung request
    then fails and is retried instead of stalling a checkpoint."""

    def threads_for(self, remote: bool) -> int:
        """io_threads, or the backend's default when unset."""
        if self.io_threads is not None:
            return self.io_threads
        return 16 if remote else max(2, os.cpu_count() or 2)

    def __post_init__(self) -> None:
        if self.io_threads is not None and self.io_threads < 1:
            raise InvalidSettings("io_threads", "must be at least 1")
        if self.pack_bytes < 1 * MiB:
            raise InvalidSettings("pack_bytes", "must be at least 1 MiB")
