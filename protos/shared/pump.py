"""The one socket pump: bytes copied both ways between two connections until either side ends.
The node's relay to the gateway and `kubectl stasis`'s port-forward both carry connections with it."""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 65536
"""Bytes read at a time; also the limit to give the connections' stream readers."""

Ends = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, other: asyncio.StreamWriter) -> None:
    """Copy one direction; when it ends, end both (the other direction's read then ends too)."""
    with contextlib.suppress(OSError, RuntimeError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()  # a slow reader holds its sender back, not this process's memory
    for writer in (dst, other):
        writer.close()


async def pump(a: Ends, b: Ends) -> None:
    """Copy `a` to `b` and `b` to `a` until either side ends; then both are closed."""
    (a_reader, a_writer), (b_reader, b_writer) = a, b
    await asyncio.gather(pipe(a_reader, b_writer, a_writer), pipe(b_reader, a_writer, b_writer))
