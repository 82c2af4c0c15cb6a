"""The Kubernetes adapter: when a cluster reclaims a node (cordon, autoscaler scale-down, spot
termination notice), drain the Stasis node of the same name before it goes; uncordon it when
Kubernetes does. The only module that imports the kubernetes client."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Protocol

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from orchestrator.domain import NodeState, NotFound, PermissionDenied, TemporaryError, Unauthenticated

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
    return client.CoreV1Api(_api_client())


AUDIENCE = "stasis"
"""The audience of the service-account tokens agents join with: a token for this use alone."""


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
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE]))
        )
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise Unauthenticated(
                f"token: Kubernetes does not vouch for it ({getattr(status, 'error', '') or 'no reason given'})"
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
            pod = client.CoreV1Api(self.api).read_namespaced_pod(pod_name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise PermissionDenied(
                    f"token: its pod {self.namespace}/{pod_name} no longer exists"
                ) from None
            raise
        if pod.metadata is None or pod.metadata.uid != pod_uid or pod.spec is None or not pod.spec.node_name:
            raise PermissionDenied(f"token: its pod {self.namespace}/{pod_name} is gone or not on a node")
        return str(pod.spec.node_name)


def _api_client() -> client.ApiClient:
    """In a pod, its service account's; elsewhere, the kubeconfig kubectl would use."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # Read $KUBECONFIG now: the client reads it only once, when it is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()
