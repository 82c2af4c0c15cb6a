"""The harness protocols the gateway speaks, each translated onto the upstream's token-level
chat or completion interface.

A `Protocol` parses a harness request into an upstream body plus its canonical form, renders a
finished `Generation` as the harness's response, and encodes a streamed one event by event. The
terminal event of a stream (`[DONE]`, `response.completed`, `message_stop`) is produced
separately, so the gateway can commit the turn before sending it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from orchestrator.gateway.generation import Generation
from orchestrator.trajectory.canonical import CanonicalRequest
from orchestrator.trajectory.turns import Sampling


class GatewayError(Exception):
    """A request the gateway refuses, in words the harness's protocol carries."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        """One of: invalid_request_error, authentication_error, permission_error, not_found_error,
        conflict_error, request_too_large, rate_limit_error, overloaded_error, upstream_error,
        server_error."""


@dataclass(frozen=True)
class Request:
    """A harness request as the gateway forwards and records it."""

    upstream_path: str
    """/chat/completions or /completions, below the upstream's /v1."""
    upstream: dict[str, Any]
    """The body sent upstream (the gateway adds token ids and log-probs)."""
    canonical: CanonicalRequest
    stream: bool
    dropped: tuple[str, ...] = ()
    """Request fields that mean nothing upstream and were left out."""
    echo: dict[str, Any] = field(default_factory=dict)
    """What the protocol needs again to render the answer (tool kinds, the request's settings)."""


class StreamEncoder(ABC):
    """Turns one streamed generation into the harness protocol's events, as they happen."""

    @abstractmethod
    def chunk(self, event: bytes, data: dict[str, Any], g: Generation) -> bytes:
        """Bytes to send for one upstream chunk (`event` its raw server-sent event), `g` already
        holding it."""

    @abstractmethod
    def close(self, g: Generation) -> bytes:
        """Everything after the last chunk but the terminal event."""

    @abstractmethod
    def terminal(self, g: Generation) -> bytes:
        """The event that tells the harness the answer is complete; sent only once recorded."""


class Protocol(ABC):
    name: str
    """chat | completion | responses | messages"""
    passthrough = False
    """The upstream speaks this protocol itself: its bytes go to the harness unchanged."""

    @abstractmethod
    def parse(self, body: dict[str, Any]) -> Request: ...

    @abstractmethod
    def render(self, g: Generation, raw: bytes, request: Request) -> bytes:
        """The whole response body for a non-streamed request (`raw` is the upstream's)."""

    @abstractmethod
    def encoder(self, request: Request, tokens: bool = False) -> StreamEncoder:
        """The stream encoder of one answer; `tokens`: the answer is read from sampled ids (the
        upstream's own events cannot be passed on)."""

    def call_id(self, upstream_id: str, index: int, g: Generation) -> str:
        """The id a harness sees for a tool call; the upstream's own unless the protocol differs."""
        return upstream_id or f"call_{g.response_id[-12:]}_{index}"

    def error(self, err: GatewayError) -> bytes:
        """The protocol's error body (OpenAI's shape unless overridden)."""
        return json.dumps(
            {"error": {"message": str(err), "type": err.kind, "param": None, "code": err.status}}
        ).encode()

    def stream_error(self, err: GatewayError) -> bytes:
        """An error event for a stream whose headers are already sent."""
        return b"data: " + self.error(err) + b"\n\n"


def sse(event: str | None, data: Any) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def require(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise GatewayError(400, f"{key}: must be {what}")
    return value


def listed(value: Any, where: str) -> list[Any]:
    """A list the harness may leave out."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise GatewayError(400, f"{where}: must be a list")
    return value


def mapped(value: Any, where: str) -> dict[str, Any]:
    """An object the harness may leave out."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GatewayError(400, f"{where}: must be an object")
    return value


def pick(body: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Copy the fields the upstream understands, renamed (harness name -> upstream name)."""
    return {up: body[name] for name, up in names.items() if body.get(name) is not None}


def sampling_of(body: dict[str, Any]) -> Sampling:
    """The sampling settings an upstream body asks for (the gateway fills in the defaults first,
    so they are what the tokens are drawn with)."""

    def number(key: str, default: float) -> float:
        value = body.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GatewayError(400, f"{key}: must be a number")
        return float(value)

    def whole(key: str) -> int:
        value = body.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise GatewayError(400, f"{key}: must be a whole number")
        return value

    return Sampling(
        temperature=number("temperature", 1.0),
        top_p=number("top_p", 1.0),
        top_k=whole("top_k"),
        max_tokens=whole("max_completion_tokens") or whole("max_tokens"),
    )
