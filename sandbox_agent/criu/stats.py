"""What CRIU measured of its own dump, from the `stats-dump` image it writes into its work
directory (criu/images/stats.proto): how long the tasks were stopped, which only CRIU knows when
it froze them itself."""

from __future__ import annotations

import struct
from pathlib import Path

IMG_SERVICE_MAGIC = 0x55105940
STATS_MAGIC = 0x57093306
STATS_DUMP = "stats-dump"


def frozen_ms(work_dir: Path) -> float | None:
    """How long the dump kept the tasks stopped, in ms: from the start of CRIU's freeze until it
    killed them or let them go (dump_stats_entry's freezing_time plus frozen_time). None if
    there is no readable stats-dump image."""
    try:
        raw = (work_dir / STATS_DUMP).read_bytes()
        if struct.unpack_from("<II", raw) != (IMG_SERVICE_MAGIC, STATS_MAGIC):
            return None
        (size,) = struct.unpack_from("<I", raw, 8)
        dump = _fields(raw[12 : 12 + size]).get(1)
        if not isinstance(dump, bytes):
            return None
        times = _fields(dump)
        freezing, frozen = times.get(1), times.get(2)
    except (OSError, struct.error, ValueError):
        return None
    if not isinstance(freezing, int) or not isinstance(frozen, int):
        return None
    return round((freezing + frozen) / 1000, 1)  # microseconds


def _fields(message: bytes) -> dict[int, int | bytes]:
    """The fields of one protobuf message by number, varints as ints and length-delimited ones as
    bytes; fixed-size ones are skipped. ValueError if it is cut short or malformed."""
    fields: dict[int, int | bytes] = {}
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], at = _varint(message, at)
        elif wire == 2:
            length, at = _varint(message, at)
            if at + length > len(message):
                raise ValueError("a field runs past the message's end")
            fields[number], at = message[at : at + length], at + length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    if at != len(message):
        raise ValueError("a field runs past the message's end")
    return fields


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint runs past the message's end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at
