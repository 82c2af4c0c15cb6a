"""The Kubernetes adapter: when a cluster reclaims a node (cordon, autoscaler scale-down, spot
termination notice), drain the Stasis node of the same name before it goes; uncordon it when
Kubernetes does. The only module that imports the kubernetes client."""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from orchestrator.domain import NodeState, NotFound

log = logging.getLogger(__name__)

RECLAIM_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
        "cloud.google.com/impending-node-termination",
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/rebalance-recommendation",
        "node.cloudprovider.kubernetes.io/shutdown",
        "karpenter.sh/disrupted",
    }
)
"""Taints that cluster tooling puts on a node it is about to take away."""


class NodeApi(Protocol):
    def list_node(self, **kwargs: Any) -> Any: ...


class NodeControl(Protocol):
    def drain(self, name: str) -> Any: ...
    def uncordon(self, name: str) -> Any: ...


class NodeStates(Protocol):
    def nodes(self) -> list[Any]: ...


def reclaim_reason(node: Any) -> str:
    """Why Kubernetes is taking this node away, or "" if it is not."""
    spec = node.spec
    if spec is not None and spec.unschedulable:
        return "cordoned in Kubernetes"
    for taint in (spec.taints if spec is not None else None) or []:
        if taint.key in RECLAIM_TAINTS:
            return f"Kubernetes taint {taint.key}"
    return ""


class NodeWatcher:
    """Polls the Kubernetes nodes and drains or uncordons the matching Stasis nodes."""

    def __init__(
        self, control: NodeControl, states: NodeStates, api: NodeApi | None = None, period_s: float = 5.0
    ):
        self.control = control
        self.states = states
        self.api = api or _in_cluster_api()
        self.period_s = period_s
        self._drained_by_us: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-node-watcher", daemon=True)

    def start(self) -> NodeWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except ApiException as exc:
                log.warning("listing Kubernetes nodes failed: %s %s", exc.status, exc.reason)
            except Exception:
                log.exception("Kubernetes node watch failed")
            self._stop.wait(self.period_s)

    def sync(self) -> list[str]:
        """One pass; returns what it did, for logs and tests."""
        stasis = {n.name: n.state for n in self.states.nodes()}
        actions = []
        for node in self.api.list_node().items:
            if node.metadata is None:
                continue
            name = str(node.metadata.name)
            state = stasis.get(name)
            if state is None:
                continue
            reason = reclaim_reason(node)
            if reason and state in (NodeState.READY, NodeState.CORDONED):
                log.info("draining node %s: %s", name, reason)
                self._drain(name)
                actions.append(f"drain {name}: {reason}")
            elif not reason and state == NodeState.DRAINING and name in self._drained_by_us:
                self.control.uncordon(name)
                self._drained_by_us.discard(name)
                actions.append(f"uncordon {name}")
        return actions

    def _drain(self, name: str) -> None:
        try:
            self.control.drain(name)
            self._drained_by_us.add(name)
        except NotFound:
            pass


def _in_cluster_api() -> client.CoreV1Api:
    config.load_incluster_config()
    return client.CoreV1Api()
