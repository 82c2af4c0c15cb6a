"""Draining nodes that Kubernetes reclaims.

No Kubernetes API server can run here, so a stand-in that returns real `kubernetes.client`
model objects plays the API (the only mock in this file); the control plane is real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from orchestrator.control import Control, ControlSettings
from orchestrator.control.kube import NodeWatcher, reclaim_reason
from orchestrator.domain import NodeRecord, NodeState
from orchestrator.state import SqliteStateStore
from snapshots import SnapshotStore


class FakeNodeApi:
    """Stands in for the Kubernetes API server's node list."""

    def __init__(self) -> None:
        self.nodes: dict[str, client.V1Node] = {}

    def set(self, name: str, unschedulable: bool = False, taints: tuple[str, ...] = ()) -> None:
        self.nodes[name] = client.V1Node(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1NodeSpec(
                unschedulable=unschedulable,
                taints=[client.V1Taint(key=t, effect="NoSchedule") for t in taints] or None,
            ),
        )

    def list_node(self, **_: Any) -> client.V1NodeList:
        return client.V1NodeList(items=list(self.nodes.values()))


@pytest.fixture
def control(tmp_path: Path) -> Any:
    store = SqliteStateStore(tmp_path / "state.db")
    with SnapshotStore.open(f"file://{tmp_path}/snapshots") as snapshots:
        c = Control(ControlSettings(), store, snapshots)
        for name in ("node-a", "node-b"):
            store.upsert_node(NodeRecord(name, "127.0.0.1:1", NodeState.READY, "runc", 2, 1024, {}, {}, 0))
        yield c
        store.close()


@pytest.mark.timeout(30)
def test_reclaimed_nodes_are_drained_and_uncordoned_when_kubernetes_lets_go(control: Control) -> None:
    api = FakeNodeApi()
    api.set("node-a")
    api.set("node-b")
    api.set("not-a-stasis-node", unschedulable=True)
    watcher = NodeWatcher(control.commands, control.store, api=api)
    assert watcher.sync() == []

    api.set("node-a", taints=("ToBeDeletedByClusterAutoscaler",))
    api.set("node-b", unschedulable=True)
    assert sorted(watcher.sync()) == [
        "drain node-a: Kubernetes taint ToBeDeletedByClusterAutoscaler",
        "drain node-b: cordoned in Kubernetes",
    ]
    assert {n.name: n.state for n in control.store.nodes()} == {
        "node-a": NodeState.DRAINING,
        "node-b": NodeState.DRAINING,
    }
    assert watcher.sync() == [], "a drain is asked once"

    api.set("node-b")
    assert watcher.sync() == ["uncordon node-b"]
    assert control.store.node("node-b").state == NodeState.READY


def test_reclaim_reasons() -> None:
    api = FakeNodeApi()
    api.set("n", taints=("cloud.google.com/impending-node-termination",))
    assert reclaim_reason(api.nodes["n"]) == "Kubernetes taint cloud.google.com/impending-node-termination"
    api.set("n", taints=("dedicated",))
    assert reclaim_reason(api.nodes["n"]) == ""
