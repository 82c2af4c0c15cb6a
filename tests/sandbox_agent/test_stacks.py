"""Two stacks on one host, and what a node's start-up reclaims of its own stack's leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_agent import SandboxSpec, SandboxState
from sandbox_agent.host import cgroups, network
from tests import faults
from tests.sandbox_agent.conftest import NodeFactory

SLEEPER = ("sleep", "600")


def _ports(host_key: str) -> set[str]:
    return {rule[rule.index("--dport") + 1] for rule in network.allowances(host_key, unmarked=False)}


@pytest.mark.timeout(120)
def test_a_second_stack_on_the_host_leaves_the_first_ones_sandboxes_and_allowance(
    make_node: NodeFactory, image_cache: Path, tmp_path: Path
) -> None:
    """Both stacks have a node-1, as every `stasis up` does; the second's start-up kills none of
    the first's sandboxes and drops none of its allowances, and both run sandboxes at once, even
    under one id."""
    with faults.second_stack(tmp_path / "first", image_cache=image_cache, allowed_ports=(61021,)) as [first]:
        first.create("s1", SandboxSpec(image="base", command=SLEEPER, address="10.254.81.1"))
        with faults.second_stack(tmp_path / "second", image_cache=image_cache, allowed_ports=(61022,)) as [
            second
        ]:
            assert first.name == second.name == "node-1"
            assert first.get("s1").state == SandboxState.RUNNING, "the second stack killed it"
            assert _ports(first.host_key) == {"61021"}, "the second stack dropped its allowance"
            assert _ports(second.host_key) == {"61022"}
            second.create("s1", SandboxSpec(image="base", command=SLEEPER, address="10.254.81.2"))
            assert first.get("s1").state == second.get("s1").state == SandboxState.RUNNING
            for node, address in ((first, "10.254.81.1"), (second, "10.254.81.2")):
                veth = network.veth_name(node.host_key, "s1")
                assert len(veth) <= 15, "Linux names a link in 15 characters"
                assert network._route_device(address) == veth
        assert first.get("s1").state == SandboxState.RUNNING, "the second stack's end took it along"
        assert _ports(first.host_key) == {"61021"}
    # A node alone on the host, as before stacks were named, keeps its names.
    alone = make_node("node-1")
    assert alone.host_key == "node-1"


# An agent that makes a sandbox and is killed outright, with no cleanup of its own.
_KILLED_AFTER_CREATE = """
import os, sys
from pathlib import Path
from sandbox_agent import AgentSettings, Node, SandboxSpec
node, root, images, sandbox, address = sys.argv[1:]
agent = Node(AgentSettings(node=node, root=Path(root), image_cache=Path(images), stack="killed"))
agent.create(sandbox, SandboxSpec(image="base", command=("sleep", "600"), address=address))
os._exit(9)
"""


@pytest.mark.timeout(120)
def test_a_leftover_sandbox_is_reclaimed_whole_at_the_next_start(
    make_node: NodeFactory, image_cache: Path, tmp_path: Path
) -> None:
    """Its agent killed hard and its record lost with the agent's state, a sandbox is a leftover:
    the next agent of its node kills it and takes its netns, veth, /32 route, cgroups and mounts
    away, so its address serves the next sandbox given it."""
    root, address = tmp_path / "node-1", "10.254.82.1"
    argv = [
        sys.executable,
        "-c",
        _KILLED_AFTER_CREATE,
        "node-1",
        str(root),
        str(image_cache),
        "orphan",
        address,
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == 9, killed.stderr[-2000:]
    host_key = "node-1.killed"
    netns, veth = network.netns_path(host_key, "orphan"), network.veth_name(host_key, "orphan")
    assert netns.exists() and network._route_device(address) == veth
    (root / "sandboxes" / "orphan" / "sandbox.json").unlink()  # lost with the agent's state

    node = make_node("node-1", stack="killed")
    assert node.list() == []
    assert not netns.exists(), "its netns is left"
    assert not Path(f"/sys/class/net/{veth}").exists(), "its veth is left"
    assert not network._routed(address), "its /32 route is left"
    assert not [h for h in cgroups.hierarchies() if (h / "stasis" / host_key / "orphan").exists()]
    with open("/proc/self/mounts") as mounts:
        assert not [
            line for line in mounts if "/orphan/" in line.split()[1] or line.split()[1].endswith("/orphan")
        ]
    node.create("again", SandboxSpec(image="base", command=SLEEPER, address=address))
    assert node.get("again").state == SandboxState.RUNNING
