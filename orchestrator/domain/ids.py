"""Every id the control plane makes, and the one place they are parsed.

    ep-0a1b2c3d4e        an episode
    ep-0a1b2c3d4e-r3     the sandbox of its third run (each start or restore is a new run)
    ep-0a1b2c3d4e-s2     its second snapshot

Sandbox addresses come from a pool; an episode keeps its address across every node it runs on.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass

from orchestrator.domain.errors import InvalidArgument

_EPISODE = r"ep-[0-9a-f]{10}"
_SANDBOX = re.compile(rf"^(?P<episode>{_EPISODE})-r(?P<run>[1-9][0-9]*)$")
_SNAPSHOT = re.compile(rf"^(?P<episode>{_EPISODE})-s(?P<sequence>[1-9][0-9]*)$")


def new_episode_id() -> str:
    return f"ep-{secrets.token_hex(5)}"


def new_gateway_token() -> str:
    """The bearer token an episode's harness presents to the inference gateway."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class SandboxId:
    episode_id: str
    run: int

    def __str__(self) -> str:
        return f"{self.episode_id}-r{self.run}"

    @classmethod
    def parse(cls, text: str) -> SandboxId | None:
        """The episode and run of a sandbox the control plane made; None for any other name."""
        m = _SANDBOX.match(text)
        return cls(m["episode"], int(m["run"])) if m else None


@dataclass(frozen=True)
class SnapshotId:
    episode_id: str
    sequence: int

    def __str__(self) -> str:
        return f"{self.episode_id}-s{self.sequence}"

    @classmethod
    def parse(cls, text: str) -> SnapshotId | None:
        m = _SNAPSHOT.match(text)
        return cls(m["episode"], int(m["sequence"])) if m else None


def sandbox_id(episode_id: str, run: int) -> str:
    return str(SandboxId(episode_id, run))


def snapshot_id(episode_id: str, sequence: int) -> str:
    return str(SnapshotId(episode_id, sequence))


def address_pool(cidr: str) -> ipaddress.IPv4Network:
    """The sandbox address pool; each live episode holds one address of it."""
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError as exc:
        raise InvalidArgument("address_pool", f"{cidr!r} is not an IPv4 network: {exc}") from exc
    if net.num_addresses < 4:
        raise InvalidArgument("address_pool", f"{cidr} is too small")
    return net
