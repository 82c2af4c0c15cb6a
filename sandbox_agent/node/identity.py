"""Who a restored sandbox is, where not the checkpointed one: a fork child's address, host name
and `ForkMark`, and the files that tell its processes they are a fork (`fork_files`).

A fork child restores another episode's snapshot. Its processes' memory is the parent's (its
environment too); what the node gives it of its own is its address (its netns, from the record's
spec), its host name (its UTS namespace, renamed in CRIU's images before they restore), and,
written into its writable layer before its processes resume, `/etc/machine-id` and
`/.stasis/fork.json`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from sandbox_agent.errors import InvalidSpec
from sandbox_agent.host import network
from sandbox_agent.runtime.backend import STATE_DIR, LayerFile
from sandbox_agent.spec import SandboxSpec, validate_hostname, validate_id

FORK_FILE = f"{STATE_DIR}/fork.json"
"""What a fork child learns of its fork; a harness may watch it to reseed itself."""
MACHINE_ID = "/etc/machine-id"

MAX_FORK_COUNT = 4096
"""More children than any fork asks for; bounds the number a hostile caller could write."""


@dataclass(frozen=True)
class ForkMark:
    """Which fork a restored sandbox is a child of (the wire's `ForkMark`)."""

    episode_id: str
    """The child's own episode."""
    parent_episode_id: str
    """The episode whose snapshot the child starts from."""
    snapshot_id: str
    index: int
    """The child's place among the fork's `count` children, from 0."""
    count: int

    def validated(self) -> ForkMark:
        validate_id("fork.episode_id", self.episode_id)
        validate_id("fork.parent_episode_id", self.parent_episode_id)
        validate_id("fork.snapshot_id", self.snapshot_id)
        if self.episode_id == self.parent_episode_id:
            raise InvalidSpec("fork.episode_id", f"{self.episode_id!r} is the parent episode itself")
        if not 1 <= self.count <= MAX_FORK_COUNT:
            raise InvalidSpec("fork.count", f"{self.count} must be between 1 and {MAX_FORK_COUNT}")
        if not 0 <= self.index < self.count:
            raise InvalidSpec(
                "fork.index", f"{self.index} must be between 0 and count - 1 ({self.count - 1})"
            )
        return self


@dataclass(frozen=True)
class Identity:
    """Who a restored sandbox is: empty fields keep the checkpoint's (a plain restore of an
    episode's own snapshot gives none)."""

    address: str = ""
    hostname: str = ""
    fork: ForkMark | None = None
    """Set for a fork child: it gets `fork_files`."""
    egress: tuple[str, ...] = ()
    """The episode's egress allowances; empty keeps the checkpoint's."""

    def validated(self) -> Identity:
        network.validate_address(self.address)
        if self.hostname:
            validate_hostname("hostname", self.hostname)
        if self.fork is not None:
            self.fork.validated()
        return self

    def spec(self, checkpointed: SandboxSpec) -> SandboxSpec:
        """The restored sandbox's spec: the checkpoint's, with this address and host name."""
        return replace(
            checkpointed,
            address=network.validate_address(self.address) or checkpointed.address,
            hostname=self.hostname or checkpointed.hostname,
            egress=self.egress or checkpointed.egress,
        )


KEEP = Identity()
"""The checkpoint's own identity."""


def machine_id(episode_id: str) -> str:
    """A machine-id of the episode's own: 32 lowercase hex digits, the same on every node and
    every restore of that episode, and never the all-zero id systemd refuses."""
    digest = hashlib.sha256(f"stasis machine-id\0{episode_id}".encode()).hexdigest()
    return digest[:32] if digest[:32].strip("0") else digest[32:]


def fork_files(mark: ForkMark) -> tuple[LayerFile, ...]:
    """What a fork child finds in its writable layer when its processes resume."""
    described = {
        "episode_id": mark.episode_id,
        "parent_episode_id": mark.parent_episode_id,
        "snapshot_id": mark.snapshot_id,
        "index": mark.index,
        "count": mark.count,
    }
    return (
        # The harness's own, like the rest of /.stasis; systemd keeps its machine-id 0444, root's.
        LayerFile(FORK_FILE, (json.dumps(described) + "\n").encode(), 0o644, harness_owned=True),
        LayerFile(MACHINE_ID, f"{machine_id(mark.episode_id)}\n".encode(), 0o444),
    )
