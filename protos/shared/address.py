"""Network addresses written as text: the one place a `host:port` is split or joined.

One rule for IPv6, on both sides: with a port, the address is in brackets (`[::1]:7070`); a
bare host may be IPv6 without them (`::1`), since with two or more colons and no brackets no
port can be meant. A host may be empty (`:7070`, every interface) where a listener takes it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence


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


def egress_problem(entries: Sequence[str]) -> tuple[int, str] | None:
    """`(index, what is wrong)` for the first entry `egress_rule` refuses, or None: one check,
    made by the orchestrator, the node agent and a task's reader, each naming the field in its
    own error."""
    for i, entry in enumerate(entries):
        try:
            egress_rule(entry)
        except ValueError as exc:
            return i, str(exc)
    return None


def egress_rule(entry: str) -> tuple[str, int | None]:
    """`(network, port)` of an egress allowance `ADDRESS[/PREFIX][:PORT]` (IPv4): where a
    sandbox may connect besides the gateway, on one TCP port or (no port) any protocol. A
    ValueError says what is wrong. Refused: a host name (a sandbox has no DNS: give addresses),
    and any network that holds a loopback, link-local (the gateway's) or multicast address."""
    text, _, port_text = entry.partition(":")
    try:
        network = ipaddress.IPv4Network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"{entry!r} is not ADDRESS[/PREFIX][:PORT] (IPv4); a host name needs DNS, which a sandbox "
            "does not have: give its addresses"
        ) from None
    port: int | None = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    for name, reserved in (
        ("loopback", "127.0.0.0/8"),
        ("link-local", "169.254.0.0/16"),
        ("multicast", "224.0.0.0/4"),
    ):
        if network.overlaps(ipaddress.IPv4Network(reserved)):
            raise ValueError(f"{entry!r} holds {name} addresses ({reserved}), which a sandbox never reaches")
    if network.network_address.is_unspecified and network.prefixlen > 0:
        raise ValueError(f"{entry!r} is the unspecified address")
    return str(network), port
