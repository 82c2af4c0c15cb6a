"""The Kubernetes adapter of the control plane: when a cluster reclaims a node (cordon,
autoscaler scale-down, spot termination notice) or deletes its agent pod, drain the Stasis node of
the same name before it goes; uncordon it when Kubernetes lets it go. With `client/kube.py`
(kubectl discovery), the only module that imports the kubernetes client."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Protocol

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from orchestrator.domain import NodeState, NotFound, PermissionDenied, TemporaryError, Unauthenticated
from orchestrator.state import StateStore

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


DRAINED_BY = "Kubernetes node watcher"
"""How the reason of each drain the watcher asks for begins: after a restart, the last change of
each draining node tells whether the watcher drained it, and so may uncordon it."""


class NodeApi(Protocol):
    def list_node(self, **kwargs: Any) -> Any: ...
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...


class NodeControl(Protocol):
    def drain(self, name: str, reason: str = ...) -> Any: ...
    def uncordon(self, name: str) -> Any: ...


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
    """Polls the Kubernetes nodes, and the agent pods in `namespace` matching `agent_selector`
    (default: $STASIS_NAMESPACE and $STASIS_AGENT_POD_SELECTOR, which the chart sets). A node
    being reclaimed, or whose agent pod is terminating, is drained; a node the watcher drained is
    uncordoned once Kubernetes lets it go, across restarts of the orchestrator."""

    def __init__(
        self,
        control: NodeControl,
        states: StateStore,
        api: NodeApi | None = None,
        period_s: float = 5.0,
        namespace: str | None = None,
        agent_selector: str | None = None,
    ):
        self.control = control
        self.states = states
        self.api = api or _in_cluster_api()
        self.period_s = period_s
        self.namespace = os.environ.get("STASIS_NAMESPACE", "") if namespace is None else namespace
        self.agent_selector = (
            os.environ.get("STASIS_AGENT_POD_SELECTOR", "") if agent_selector is None else agent_selector
        )
        self._drained_by_us = self._recall()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-node-watcher", daemon=True)

    def _recall(self) -> set[str]:
        """The draining nodes whose drain this watcher asked for, before a restart or now."""
        draining = {n.name for n in self.states.nodes.all() if n.state == NodeState.DRAINING}
        why: dict[str, str] = {}
        seq = 0
        while batch := self.states.events.read(since_seq=seq, episode_ids=("",), limit=1000):
            for event in batch:
                if event.kind == "node" and event.node in draining:
                    why[event.node] = event.reason
            seq = batch[-1].seq
        return {name for name, reason in why.items() if reason.startswith(DRAINED_BY)}

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
                log.warning(
                    "asking Kubernetes for nodes and agent pods failed: %s %s", exc.status, exc.reason
                )
            except Exception:
                log.exception("Kubernetes node watch failed")
            self._stop.wait(self.period_s)

    def sync(self) -> list[str]:
        """One pass; returns what it did, for logs and tests."""
        stasis = {n.name: n.state for n in self.states.nodes.all()}
        reasons = {}
        for node in self.api.list_node().items:
            if node.metadata is not None and node.metadata.name in stasis:
                reasons[str(node.metadata.name)] = reclaim_reason(node)
        for name, why in self._leaving_agents().items():
            if name in stasis and not reasons.get(name):
                reasons[name] = why
        actions = []
        for name, reason in sorted(reasons.items()):
            state = stasis[name]
            if reason and state in (NodeState.READY, NodeState.CORDONED):
                log.info("draining node %s: %s", name, reason)
                self._drain(name, reason)
                actions.append(f"drain {name}: {reason}")
            elif not reason and state == NodeState.DRAINING and name in self._drained_by_us:
                self.control.uncordon(name)
                self._drained_by_us.discard(name)
                actions.append(f"uncordon {name}")
        return actions

    def _leaving_agents(self) -> dict[str, str]:
        """Nodes whose agent pod Kubernetes is deleting (a DaemonSet update, a node drain that
        evicts it): their sandboxes go elsewhere before the agent stops."""
        if not (self.namespace and self.agent_selector):
            return {}
        pods = self.api.list_namespaced_pod(self.namespace, label_selector=self.agent_selector).items
        leaving, staying = {}, set()
        for pod in pods:
            node = pod.spec.node_name if pod.spec is not None else None
            if pod.metadata is None or not node:
                continue
            if pod.metadata.deletion_timestamp:
                leaving[str(node)] = f"its agent pod {self.namespace}/{pod.metadata.name} is terminating"
            else:
                staying.add(str(node))
        # A DaemonSet update may start the new pod before the old one is gone.
        return {node: why for node, why in leaving.items() if node not in staying}

    def _drain(self, name: str, reason: str) -> None:
        try:
            self.control.drain(name, f"{DRAINED_BY}: {reason}")
            self._drained_by_us.add(name)
        except NotFound:
            pass


def _in_cluster_api() -> client.CoreV1Api:
    return client.CoreV1Api(_api_client())


AUDIENCE = "stasis"
"""The audience of the service-account tokens agents join with: a token for this use alone."""
KUBE_TIMEOUT_S = 5.0
"""How long a join waits on each call to the Kubernetes API before it is refused as unavailable
(the agent retries): a slow API server holds no join, and no thread of the orchestrator, longer."""


class NodeIdentities:
    """Which node a joining agent runs on, from its pod's service-account token: a TokenReview says
    whose token it is and which pod it was issued to, and that pod says which node it is on.

    Only tokens of the agents' own service account count, and only while their pod lives."""

    def __init__(self, service_account: str, api: client.ApiClient | None = None) -> None:
        namespace, _, name = service_account.partition(":")
        if not namespace or not name:
            raise ValueError(f"{service_account!r} is not NAMESPACE:NAME of the agents' service account")
        self.namespace, self.account = namespace, name
        self.api = api or _api_client()

    def node_of(self, token: str) -> str:
        """The node whose agent pod holds `token`; Unauthenticated or PermissionDenied if none,
        TemporaryError if Kubernetes cannot be asked."""
        try:
            return self._node_of(token)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise TemporaryError(f"the Kubernetes API did not answer: {exc}", delay=2.0) from None

    def _node_of(self, token: str) -> str:
        review = client.AuthenticationV1Api(self.api).create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE])),
            _request_timeout=KUBE_TIMEOUT_S,
        )
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise Unauthenticated(
                f"token: Kubernetes does not vouch for it ({getattr(status, 'error', '') or 'no reason given'})"
            )
        # An authenticator that ignores the audiences asked for vouches for a token minted for
        # any use: it must name ours among those it checked.
        if AUDIENCE not in (status.audiences or []):
            raise Unauthenticated(
                f"token: Kubernetes did not confirm it is for the audience {AUDIENCE!r}"
                f" (it named {status.audiences or []}); agents join with a projected token for it"
            )
        who = status.user.username or ""
        if who != f"system:serviceaccount:{self.namespace}:{self.account}":
            raise PermissionDenied(
                f"token: it belongs to {who!r}, not to the agents' service account {self.namespace}:{self.account}"
            )
        extra = status.user.extra or {}
        pod_name = (extra.get("authentication.kubernetes.io/pod-name") or [""])[0]
        pod_uid = (extra.get("authentication.kubernetes.io/pod-uid") or [""])[0]
        if not pod_name:
            raise PermissionDenied("token: it is bound to no pod; agents join with a projected pod token")
        try:
            pod = client.CoreV1Api(self.api).read_namespaced_pod(
                pod_name, self.namespace, _request_timeout=KUBE_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                raise PermissionDenied(
                    f"token: its pod {self.namespace}/{pod_name} no longer exists"
                ) from None
            raise
        if pod.metadata is None or pod.metadata.uid != pod_uid or pod.spec is None or not pod.spec.node_name:
            raise PermissionDenied(f"token: its pod {self.namespace}/{pod_name} is gone or not on a node")
        return str(pod.spec.node_name)

    def addresses_of(self, node: str) -> set[str]:
        """Where Kubernetes has node `node`: the addresses of the agents' pods on it (with host
        networking, the node's own) and those the node itself lists. TemporaryError if
        Kubernetes cannot be asked."""
        try:
            return self._addresses_of(node)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise TemporaryError(f"the Kubernetes API did not answer: {exc}", delay=2.0) from None

    def _addresses_of(self, node: str) -> set[str]:
        core = client.CoreV1Api(self.api)
        pods = core.list_namespaced_pod(
            self.namespace, field_selector=f"spec.nodeName={node}", _request_timeout=KUBE_TIMEOUT_S
        ).items
        found: set[str] = set()
        for pod in pods:
            if pod.spec is None or pod.spec.service_account_name != self.account or pod.status is None:
                continue
            found |= {ip.ip for ip in pod.status.pod_ips or [] if ip.ip}
            found |= {pod.status.pod_ip} if pod.status.pod_ip else set()
        try:
            listed = core.read_node(node, _request_timeout=KUBE_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            status = listed.status
            found |= {a.address for a in (status.addresses if status else None) or [] if a.address}
        return found


def _api_client() -> client.ApiClient:
    """In a pod, its service account's; elsewhere, the kubeconfig kubectl would use."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # Read $KUBECONFIG now: the client reads it only once, when it is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()
