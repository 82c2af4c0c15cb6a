"""Network addresses written as text: the one place a `host:port` is split or joined.

One rule for IPv6, on both sides: with a port, the address is in brackets (`[::1]:7070`); a
bare host may be IPv6 without them (`::1`), since with two or more colons and no brackets no
port can be meant. A host may be empty (`:7070`, every interface) where a listener takes it.
"""

from __future__ import annotations


def split_host_port(value: str, field: str = "address") -> tuple[str, int]:
    """`(host, port)` of `HOST:PORT` or `[IPV6]:PORT`, without the brackets; a ValueError
    naming `field` if the port is missing or not a number from 0 to 65535."""
    host, port = _split(value, field)
    if port is None:
        raise ValueError(f"{field}: {value!r} has no port; write HOST:PORT, or [IPV6]:PORT")
    return host, port


def host_of(value: str, field: str = "address") -> str:
    """The host of `HOST`, `HOST:PORT`, `[IPV6]`, `[IPV6]:PORT` or a bare IPv6 address."""
    return _split(value, field)[0]


def join_host_port(host: str, port: int) -> str:
    """`HOST:PORT`, with an IPv6 host in brackets: what `split_host_port` reads back."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(value: str, field: str) -> tuple[str, int | None]:
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise ValueError(f"{field}: {value!r} must be [IPV6] or [IPV6]:PORT")
        return host, _port(rest[1:], value, field) if rest else None
    if value.count(":") > 1:
        return value, None  # a bare IPv6 address: a port would need brackets
    host, colon, port = value.partition(":")
    return host, _port(port, value, field) if colon else None


def _port(text: str, value: str, field: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(f"{field}: {value!r} has no valid port (a number from 0 to 65535)")
    return int(text)
