"""Forks on a real two-node stack: runc, CRIU, the snapshot store and the control loop."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import StasisClient
from orchestrator.cli.local import LocalStack
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.programs import fork_counter

# The reward a verifier reads from the child's own final files: its fork index, from the mark
# on the last line it wrote, as (index + 1) / 10.
OWN_MARK = [
    "python3", "-c",
    "mark = open('/episode/work/steps.log').read().split()[-1]; print((int(mark) + 1) / 10)",
]  # fmt: skip


def _log(client: StasisClient, episode_id: str) -> bytes:
    return b"".join(client.logs(episode_id))


@pytest.mark.timeout(300)
def test_a_stateful_episode_forked_4_ways_mid_run_goes_on_in_each_child_across_both_nodes(
    make_stack: Callable[..., LocalStack],
) -> None:
    """The parent stops at the fork; each child resumes its memory and files there, on either
    node, learns its index from /.stasis/fork.json, writes on alone, and is graded on its own."""
    stack = make_stack(nodes=2, slots=3)
    spec = {
        "image": "base",
        "command": ["python3", "-c", fork_counter(40)],
        "resources": {"cpus": 0.5, "memory_mb": 256, "disk_mb": 1024},
        "reward": {"command": OWN_MARK},
    }
    with stack.client() as client:
        parent = client.submit(spec).id
        client.wait(parent, ["RUNNING"], timeout_s=60)
        wait_until(lambda: b"step 6 " in _log(client, parent), 60, "six steps before the fork")
        snapshot, children = client.fork(parent, 4, now=True, stop=True)
        assert client.get(parent).state == "PREEMPTED" and client.get(parent).held
        assert [c.fork_index for c in children] == [0, 1, 2, 3]
        nodes = {client.wait(c.id, ["RUNNING"], timeout_s=120).node for c in children}
        assert nodes == {"node-1", "node-2"}, "children are spread over the nodes that can take them"
        for index, child in enumerate(children):
            done = client.wait(child.id, ["SUCCEEDED"], timeout_s=180)
            log = _log(client, child.id)
            assert done.exit_code == 0, f"child {index}'s memory or files disagree: {log[-400:]!r}"
            assert done.reward == pytest.approx((index + 1) / 10), "graded on its own files"
            assert b"step 6 as root" in log and f"as {index}".encode() in log
        (taken,) = [s for s in client.snapshots(parent) if s.id == snapshot]
        assert taken.forks == [c.id for c in children]
        client.cancel(parent)
