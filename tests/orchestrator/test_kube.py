"""Draining nodes that Kubernetes reclaims, and uncordoning them when it lets them go.

No Kubernetes API server can run here: the stand-in of `tests/kubeapi.py` serves nodes and pods
over HTTP, and the real `kubernetes` client asks it; the control plane and its store are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from orchestrator.control import Control, ControlSettings
from orchestrator.control.kube import NodeWatcher, reclaim_reason
from orchestrator.domain import NodeRecord, NodeState
from orchestrator.state import SqliteStateStore
from snapshots import SnapshotStore
from tests.kubeapi import StandInApiServer

AGENTS = "app.kubernetes.io/instance=rl,app.kubernetes.io/component=agent"


def _node(name: str, unschedulable: bool = False, taints: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"unschedulable": unschedulable}
    if taints:
        spec["taints"] = [{"key": t, "effect": "NoSchedule"} for t in taints]
    return {"metadata": {"name": name}, "spec": spec}


def _agent_pod(name: str, node: str, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "stasis",
        "labels": {"app.kubernetes.io/instance": "rl", "app.kubernetes.io/component": "agent"},
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "agent"}]}}


@pytest.fixture
def kube() -> Iterator[StandInApiServer]:
    api = StandInApiServer()
    yield api
    api.stop()


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    store = SqliteStateStore(tmp_path / "state.db")
    with SnapshotStore.open(f"file://{tmp_path}/snapshots") as snapshots:
        c = Control(ControlSettings(), store, snapshots)
        for name in ("node-a", "node-b"):
            store.nodes.upsert(NodeRecord(name, "127.0.0.1:1", NodeState.READY, "runc", 2, 1024, {}, {}, 0))
        yield c
        store.close()


def _watcher(control: Control, kube: StandInApiServer) -> NodeWatcher:
    return NodeWatcher(
        control.commands, control.store, api=kube.client(), namespace="stasis", agent_selector=AGENTS
    )


@pytest.mark.timeout(30)
def test_reclaimed_nodes_are_drained_and_uncordoned_when_kubernetes_lets_go(
    control: Control, kube: StandInApiServer
) -> None:
    for name in ("node-a", "node-b"):
        kube.put("nodes", _node(name))
    kube.put("nodes", _node("not-a-stasis-node", unschedulable=True))
    watcher = _watcher(control, kube)
    assert watcher.sync() == []

    kube.put("nodes", _node("node-a", taints=("ToBeDeletedByClusterAutoscaler",)))
    kube.put("nodes", _node("node-b", unschedulable=True))
    assert watcher.sync() == [
        "drain node-a: Kubernetes taint ToBeDeletedByClusterAutoscaler",
        "drain node-b: cordoned in Kubernetes",
    ]
    assert {n.name: n.state for n in control.store.nodes.all()} == {
        "node-a": NodeState.DRAINING,
        "node-b": NodeState.DRAINING,
    }
    assert watcher.sync() == [], "a drain is asked once"

    kube.put("nodes", _node("node-b"))
    assert watcher.sync() == ["uncordon node-b"]
    assert control.store.nodes.get("node-b").state == NodeState.READY


@pytest.mark.timeout(30)
def test_which_nodes_it_drained_survives_a_restart(control: Control, kube: StandInApiServer) -> None:
    kube.put("nodes", _node("node-a", unschedulable=True))
    kube.put("nodes", _node("node-b"))
    assert _watcher(control, kube).sync() == ["drain node-a: cordoned in Kubernetes"]
    control.commands.drain("node-b", "drain requested")  # an operator's drain: not the watcher's to undo

    kube.put("nodes", _node("node-a"))
    restarted = _watcher(control, kube)
    assert restarted.sync() == ["uncordon node-a"]
    assert control.store.nodes.get("node-b").state == NodeState.DRAINING


@pytest.mark.timeout(30)
def test_a_node_whose_agent_pod_is_terminating_is_drained(control: Control, kube: StandInApiServer) -> None:
    for name in ("node-a", "node-b"):
        kube.put("nodes", _node(name))
    kube.put("pods", _agent_pod("rl-agent-a", "node-a"))
    kube.put("pods", _agent_pod("rl-agent-b", "node-b"))
    other_release = _agent_pod("other-agent", "node-b", terminating=True)
    other_release["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    kube.put("pods", other_release)
    watcher = _watcher(control, kube)
    assert watcher.sync() == []

    kube.put("pods", _agent_pod("rl-agent-a", "node-a", terminating=True))
    assert watcher.sync() == ["drain node-a: its agent pod stasis/rl-agent-a is terminating"]
    assert control.store.nodes.get("node-a").state == NodeState.DRAINING

    kube.remove("pods", "stasis", "rl-agent-a")
    kube.put("pods", _agent_pod("rl-agent-a2", "node-a"))
    assert watcher.sync() == ["uncordon node-a"], "the new agent pod runs"


def test_reclaim_reasons() -> None:
    def node(*taints: str) -> client.V1Node:
        return client.V1Node(
            spec=client.V1NodeSpec(taints=[client.V1Taint(key=t, effect="NoSchedule") for t in taints])
        )

    assert reclaim_reason(node("cloud.google.com/impending-node-termination")) == (
        "Kubernetes taint cloud.google.com/impending-node-termination"
    )
    assert reclaim_reason(node("dedicated")) == ""
