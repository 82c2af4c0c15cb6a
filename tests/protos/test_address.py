"""The one host:port parser both sides use, and its one rule for IPv6."""

from __future__ import annotations

import re

import pytest

from protos.shared.address import egress_rule, host_of, join_host_port, split_host_port


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


@pytest.mark.timeout(10)
def test_an_egress_allowance_is_an_address_or_network_with_an_optional_port() -> None:
    assert egress_rule("10.254.254.1") == ("10.254.254.1/32", None)
    assert egress_rule("10.8.0.0/16:443") == ("10.8.0.0/16", 443)
    assert egress_rule("10.8.1.9/16") == ("10.8.0.0/16", None), "the network its address is in"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("pypi.org", "a host name needs DNS"),
        ("pypi.org:443", "a host name needs DNS"),
        ("10.0.0.1:http", "the port must be a number"),
        ("10.0.0.1:0", "the port must be a number"),
        ("10.0.0.1:65536", "the port must be a number"),
        ("127.0.0.1", "holds loopback addresses"),
        ("169.254.1.1:8080", "holds link-local addresses"),
        ("0.0.0.0/0", "holds loopback addresses"),
        ("224.0.0.1", "holds multicast addresses"),
        ("0.0.0.0", "unspecified"),
        ("::1", "IPv4"),
    ],
)
def test_an_egress_allowance_that_names_no_place_a_sandbox_may_reach_is_refused(entry: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        egress_rule(entry)


@pytest.mark.timeout(10)
def test_each_side_names_a_bad_egress_allowance_in_its_own_error() -> None:
    from orchestrator.domain import EpisodeSpec, InvalidArgument
    from sandbox_agent.errors import InvalidSpec
    from sandbox_agent.spec import SandboxSpec

    with pytest.raises(InvalidArgument, match=r"^spec\.egress\[1\]: 'pypi\.org'"):
        EpisodeSpec(image="base", egress=("10.0.0.1", "pypi.org")).validate()
    with pytest.raises(InvalidSpec, match=r"^egress\[0\]: '127\.0\.0\.1' holds loopback"):
        SandboxSpec(image="base", address="10.200.0.9", egress=("127.0.0.1",)).validated()
    with pytest.raises(InvalidSpec, match="needs an address"):
        SandboxSpec(image="base", egress=("10.0.0.1",)).validated()
