"""Faults a test injects on this machine, for the suite and the soak alike: each a context
manager that undoes itself however the block ends."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from sandbox_agent import AgentSettings, Node
from sandbox_agent.host import network

TAG = "stasis-test-fault"
"""The comment on every rule a fault adds, so a leftover one is easy to find and remove."""


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)


@contextmanager
def silent_link(host: str, port: int) -> Iterator[None]:
    """Drop every TCP packet to or from `host`:`port`, as a link that goes silent does: no reset,
    no error, nothing answered, so each end's kernel retransmits until its own timeouts give up.

    Only for a loopback `host` (the rules sit in OUTPUT, which every packet between two local
    addresses passes). Give the server a second loopback address of its own to silence one
    client's link while others keep theirs (`tests.postgres.HOSTS`)."""
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"silent_link: {host} is not a loopback address; tests stay on this machine")
    rules = [
        ["-d", host, "-p", "tcp", "--dport", str(port)],
        ["-s", host, "-p", "tcp", "--sport", str(port)],
    ]
    added: list[list[str]] = []
    try:
        for match in rules:
            rule = [*match, "-m", "comment", "--comment", TAG, "-j", "DROP"]
            done = _iptables("-I", "OUTPUT", "1", *rule)
            if done.returncode != 0:
                raise RuntimeError(f"iptables could not add {rule}: {done.stderr.strip()}")
            added.append(rule)
        yield
    finally:
        for rule in added:
            _iptables("-D", "OUTPUT", *rule)


def leftover_rules() -> list[str]:
    """Rules a fault added and did not take away (for the suite's check of what tests leave)."""
    listed = _iptables("-S", "OUTPUT").stdout.splitlines()
    return [line for line in listed if TAG in line]


@contextmanager
def small_disk(mount_point: Path, size_mb: int) -> Iterator[Path]:
    """A filesystem of `size_mb` of its own at `mount_point` (ext4 in a sparse file, loop-mounted),
    for a node whose disk a test fills without touching the machine's."""
    image = mount_point.with_name(mount_point.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    mount_point.mkdir(parents=True)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True, capture_output=True)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", str(mount_point)], check=True, capture_output=True)
    finally:
        image.unlink()
        mount_point.rmdir()


@contextmanager
def full_disk(directory: Path, leave_mb: int) -> Iterator[None]:
    """Fill the filesystem holding `directory` until `leave_mb` MiB are left free (one allocated
    file there, removed at the end), as a node's other tenants do."""
    st = os.statvfs(directory)
    fill = st.f_bavail * st.f_frsize - (leave_mb << 20)
    path = directory / f".{TAG}-fill"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        if fill > 0:
            os.posix_fallocate(fd, 0, fill)
        yield
    finally:
        os.close(fd)
        path.unlink()


@contextmanager
def second_stack(state_dir: Path, nodes: int = 1, **settings: object) -> Iterator[list[Node]]:
    """Start another stack's node agents on this host, as a second `stasis up` given its own
    `state_dir` would: nodes named node-1..N like every stack's, each with its root under
    <state_dir>/nodes and the stack name `stasis up` gives that state dir. They run in this
    process, and start as such agents do: each cleans up its stack's leftovers and sets its
    gateway allowances (`settings` are further `AgentSettings` fields: image_cache,
    allowed_ports, ...). On the way out each deletes its sandboxes, and its allowances go."""
    from orchestrator.cli.local import LocalSettings  # the control plane, for this fault alone

    stack = LocalSettings(state_dir=state_dir).stack
    started: list[Node] = []
    with ExitStack() as undo:
        for i in range(1, nodes + 1):
            name = f"node-{i}"
            root = state_dir / "nodes" / name
            node = Node(AgentSettings(node=name, root=root, stack=stack, **settings))  # type: ignore[arg-type]
            undo.callback(_forget_node, node)
            started.append(node)
        yield started


def _forget_node(node: Node) -> None:
    """A node of a `second_stack` gone: its sandboxes deleted, its allowances taken away."""
    try:
        node.delete_all()
    finally:
        for rule in network.allowances(node.host_key, unmarked=False):
            _iptables("-D", network.ISOLATION_CHAIN, *rule)
