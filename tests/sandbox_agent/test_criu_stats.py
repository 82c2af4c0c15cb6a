"""Reading how long CRIU kept a dump's tasks frozen from its stats-dump image, hand-encoded here
as CRIU writes it (criu/images/stats.proto), and refusing a damaged one."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sandbox_agent.criu import stats


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _image(entry: bytes, magic: int = stats.STATS_MAGIC) -> bytes:
    return struct.pack("<III", stats.IMG_SERVICE_MAGIC, magic, len(entry)) + entry


DUMP = b"".join(
    _field(n, v)
    for n, v in ((1, 1_500), (2, 48_012), (3, 30_000), (4, 12_000), (5, 1 << 40), (6, 0), (7, 16_400), (9, 0))
)


@pytest.mark.timeout(10)
def test_the_frozen_time_is_the_freeze_and_what_followed_it(tmp_path: Path) -> None:
    (tmp_path / "stats-dump").write_bytes(_image(_field(1, DUMP)))
    assert stats.frozen_ms(tmp_path) == 49.5
    # Fields it does not know, fixed-size ones among them, are passed over.
    fixed = _varint(15 << 3 | 1) + bytes(8) + _varint(16 << 3 | 5) + bytes(4)
    (tmp_path / "stats-dump").write_bytes(_image(_field(1, DUMP + fixed) + _field(3, b"later")))
    assert stats.frozen_ms(tmp_path) == 49.5


@pytest.mark.timeout(10)
def test_a_missing_or_damaged_stats_image_says_nothing(tmp_path: Path) -> None:
    image = tmp_path / "stats-dump"
    assert stats.frozen_ms(tmp_path) is None
    for raw in (
        b"",
        _image(_field(1, DUMP), magic=0x12345678),  # another image's magic
        _image(_field(1, DUMP))[:-3],  # cut short
        _image(_field(2, DUMP)),  # a restore's stats, no dump's
        _image(_field(1, _field(1, 1_500))),  # no frozen_time
        _image(_field(1, DUMP + b"\xff")),  # a varint that never ends
        _image(_field(1, DUMP + _varint(7 << 3 | 3))),  # a group, which CRIU never writes
    ):
        image.write_bytes(raw)
        assert stats.frozen_ms(tmp_path) is None, raw
