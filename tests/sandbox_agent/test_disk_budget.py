"""The node's disk for sandboxes: layers held whole, room kept to stage a checkpoint, stagings
that wait for each other rather than fill the disk. In-process; the real node is in
`test_red_team.py::test_a_node_refuses_what_its_disk_cannot_hold`."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from sandbox_agent.errors import NoRoom
from sandbox_agent.node.disk import DiskBudget
from sandbox_agent.server.service import status_code
from sandbox_agent.spec import Resources

SMALL = Resources(disk_mb=20, memory_mb=20)
"""A layer of 20 MiB, and 40 to stage a checkpoint of it."""


@pytest.mark.timeout(10)
def test_a_sandbox_is_admitted_only_with_room_for_its_layer_and_one_staging_beside_every_layer() -> None:
    budget = DiskBudget("node-a", 90)
    budget.hold("a", SMALL)
    budget.hold("b", SMALL)  # 40 of layers and 40 to stage: 80
    with pytest.raises(NoRoom) as refused:
        budget.hold("c", SMALL)  # 60 + 40 > 90
    message = str(refused.value)
    assert "node-a" in message and "'c'" in message and "resources.disk_mb" in message, message
    assert "holds 40 MiB of layers" in message and "keeps 40 MiB for staging" in message, message
    assert status_code(refused.value) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert budget.held_mb == 40, "a refusal holds nothing"
    budget.release("b")
    budget.hold("c", SMALL)
    # A sandbox found at start is counted whatever is left: it is there already.
    budget.hold("found", Resources(disk_mb=500, memory_mb=20), admit=False)
    assert budget.held_mb == 540


@pytest.mark.timeout(10)
def test_a_staging_that_does_not_fit_waits_for_another_to_end_and_gives_up_with_a_reason() -> None:
    budget = DiskBudget("node-a", 90)
    budget.hold("a", SMALL)
    budget.hold("b", SMALL)
    with budget.staging("a", 40, "checkpoint", timeout_s=5):
        # 40 of layers and 40 staging: a second staging of 40 cannot go on beside it now...
        with pytest.raises(NoRoom) as refused, budget.staging("b", 40, "restore", timeout_s=0.2):
            pass
        assert "restore of sandbox 'b'" in str(refused.value) and "10 MiB of the node's 90" in str(
            refused.value
        )
        # ...nor a new sandbox, whose layer would eat into what the staging under way holds.
        with pytest.raises(NoRoom):
            budget.hold("c", Resources(disk_mb=20, memory_mb=0))
        waited = threading.Event()

        def second() -> None:
            with budget.staging("b", 40, "checkpoint", timeout_s=5):
                waited.set()

        began = time.monotonic()
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        assert not waited.is_set(), "it waits while the first staging holds the room"
    waiter.join(5)
    assert waited.is_set() and time.monotonic() - began >= 0.3
    assert budget.held_mb == 40, "both stagings gave their room back"
