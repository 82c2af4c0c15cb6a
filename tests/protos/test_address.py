"""The one host:port parser both sides use, and its one rule for IPv6."""

from __future__ import annotations

import re

import pytest

from protos.shared.address import host_of, join_host_port, split_host_port


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:7070", ("127.0.0.1", 7070)),
        ("node-a.example:80", ("node-a.example", 80)),
        ("[::1]:80", ("::1", 80)),
        ("[fd00::7]:0", ("fd00::7", 0)),
        (":9000", ("", 9000)),
    ],
)
def test_a_host_and_port_split(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected
    assert split_host_port(join_host_port(*expected)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("localhost", "localhost"),
        ("localhost:5000", "localhost"),
        ("10.0.0.7", "10.0.0.7"),
        ("::1", "::1"),
        ("fd00::7", "fd00::7"),
        ("[::1]", "::1"),
        ("[::1]:5000", "::1"),
        ("", ""),
    ],
)
def test_a_host_is_read_with_or_without_its_port(value: str, expected: str) -> None:
    assert host_of(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("localhost", "has no port"),
        ("::1", "has no port"),  # a bare IPv6 address cannot carry a port
        ("::1:80", "has no port"),
        ("host:", "no valid port"),
        ("host:http", "no valid port"),
        ("host:65536", "no valid port"),
        ("[::1", "must be [IPV6]"),
        ("[::1]80", "must be [IPV6]"),
        ("[]:80", "must be [IPV6]"),
        ("[::1]:x", "no valid port"),
    ],
)
def test_a_bad_address_is_refused_naming_its_field(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"^--listen: .*{re.escape(why)}"):
        split_host_port(value, "--listen")


def test_an_ipv6_host_is_joined_in_brackets() -> None:
    assert join_host_port("::", 7070) == "[::]:7070"
    assert join_host_port("10.0.0.7", 7070) == "10.0.0.7:7070"
