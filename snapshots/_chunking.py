"""Content-defined chunking (FastCDC) and the stored chunk encoding: zstd frames named by the hash
of their raw bytes (BLAKE3 for chunks in packs; SHA-256 for the objects of format v1)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import blake3
import zstandard
from pyfastcdc import FastCDC

from ._settings import ChunkingSettings

if not FastCDC.__module__.startswith("pyfastcdc.cy"):
    # The package falls back to pure Python, about 200 times slower, with only a warning.
    raise ImportError("pyfastcdc's compiled chunker is missing: reinstall pyfastcdc from a wheel")

CHUNK_PREFIX = "chunks/"
DELTA_LEVEL = 5
"""The least zstd level for delta chunks. Levels 1 to 4 (zstd's fast strategies) found few of a
base's bytes once chunk and base passed 128 KiB together: a 170 KB chunk of interpreter heap with
one page in eight changed took 22 KB against its base at level 3, 158 bytes at level 5, in about
1.4 times the time (measured)."""


def chunk_key(digest: str) -> str:
    """Object key of a chunk: fanned out by the first byte so no directory holds millions."""
    return f"{CHUNK_PREFIX}{digest[:2]}/{digest}"


def digest_of_key(key: str) -> str | None:
    """The chunk hash a key names, or None if the key is not a chunk key."""
    if not key.startswith(CHUNK_PREFIX):
        return None
    name = key.rsplit("/", 1)[-1]
    return name if len(name) == 64 and key == chunk_key(name) else None


def cut_points(view: memoryview, settings: ChunkingSettings) -> Iterator[tuple[int, int]]:
    """Yield (offset, length) of each content-defined chunk of view, in order.

    FastCDC 2020 (`pyfastcdc`, a port of fastcdc-rs that cuts where it does), which releases the
    GIL while it scans: the chunk threads compress and hash beside it. It skips `min_size` bytes
    before looking for a cut, so it is asked for `avg_size - min_size` to make chunks of
    `avg_size` on average."""
    cdc = FastCDC(
        settings.avg_size - settings.min_size,
        min_size=settings.min_size,
        max_size=settings.max_size,
    )
    for chunk in cdc.cut_buf(view):
        yield chunk.offset, chunk.length


def describe(settings: ChunkingSettings) -> dict[str, object]:
    """The chunking parameters as recorded in each manifest."""
    return {
        "algorithm": "fastcdc-2020",
        "min_size": settings.min_size,
        "avg_size": settings.avg_size,
        "max_size": settings.max_size,
        "hash": "blake3",
        "compression": f"zstd-{settings.compression_level}",
    }


class ChunkMismatch(Exception):
    """A stored chunk does not decode to the bytes its key promises (internal; callers add context)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class ChunkCodec:
    """Compresses and verifies chunks; zstd contexts are per thread because they are not thread-safe."""

    def __init__(self, level: int) -> None:
        self._level = level
        self._local = threading.local()

    def _compressor(self) -> zstandard.ZstdCompressor:
        c: zstandard.ZstdCompressor | None = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = zstandard.ZstdCompressor(level=self._level, write_content_size=True)
        return c

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        d: zstandard.ZstdDecompressor | None = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor()
        return d

    @staticmethod
    def digest(raw: memoryview | bytes, packed: bool = True) -> str:
        """The name of a chunk: BLAKE3 hex of its raw bytes, or SHA-256 hex for a v1 object."""
        return blake3.blake3(raw).hexdigest() if packed else hashlib.sha256(raw).hexdigest()

    def encode(self, raw: memoryview | bytes) -> bytes:
        """The stored form of a chunk: one zstd frame that records its content size."""
        return self._compressor().compress(raw)

    def encode_delta(self, raw: memoryview | bytes, base: bytes) -> bytes:
        """The stored form of a delta chunk: one zstd frame compressed against the raw bytes of
        its base, as a raw-content dictionary (so what the two share costs a few bytes)."""
        return zstandard.ZstdCompressor(
            level=max(self._level, DELTA_LEVEL), write_content_size=True, dict_data=_raw_dictionary(base)
        ).compress(raw)

    def decode(
        self,
        blob: bytes | memoryview,
        digest: str,
        length: int,
        packed: bool = True,
        base: bytes | None = None,
    ) -> bytes:
        """Decompress and verify a stored chunk against its hash and expected raw length; a delta
        chunk against the raw bytes of its (verified) base."""
        try:
            # A corrupt header could claim any size; refuse before allocating it.
            declared = zstandard.frame_content_size(blob)
            if declared != length:
                raise ChunkMismatch(
                    "length-mismatch", f"frame declares {declared} bytes, manifest says {length}"
                )
            if base is None:
                raw = self._decompressor().decompress(blob, max_output_size=length)
            else:
                raw = zstandard.ZstdDecompressor(dict_data=_raw_dictionary(base)).decompress(
                    blob, max_output_size=length
                )
        except zstandard.ZstdError as exc:
            raise ChunkMismatch("undecodable-chunk", f"zstd frame does not decode: {exc}") from None
        if len(raw) != length:
            raise ChunkMismatch("length-mismatch", f"decodes to {len(raw)} bytes, manifest says {length}")
        actual = self.digest(raw, packed)
        if actual != digest:
            raise ChunkMismatch("hash-mismatch", f"content hashes to {actual}")
        return raw


def _raw_dictionary(base: bytes) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
