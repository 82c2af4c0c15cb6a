"""The one socket pump: bytes copied both ways between two connections until either side ends.
The node's relay to the gateway and `kubectl stasis`'s port-forward both carry connections with
it; the relay and the gateway's front door answer one they will not carry with `refusal`."""

from __future__ import annotations

import asyncio
import contextlib
import json

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


def refusal(message: str) -> bytes:
    """A whole HTTP 503 reply, in the form a model API gives when overloaded, so that a harness's
    client backs off and retries."""
    body = json.dumps({"error": {"type": "overloaded_error", "message": message}}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body
