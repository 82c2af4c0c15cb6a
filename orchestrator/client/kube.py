"""`kubectl stasis` with no address: find the orchestrator of a Helm release in the current
Kubernetes context and namespace, reach it through a port-forward, and take its credential from
the release's Secrets, as `kubectl port-forward` and `kubectl get secret` would.

What the chart makes is found by its labels: the Service (`app.kubernetes.io/part-of=stasis`,
`app.kubernetes.io/component=orchestrator`) and its `grpc` port, a ready Pod behind it, the
cluster CA's `ca.crt` and the operator token's `token`. The CA file is written under a private
temporary directory, removed when the process exits. The caller's kubeconfig needs `get` and `list`
on services, pods and secrets, and `create` on pods/portforward, in that namespace.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import logging
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward

from orchestrator.client.config import Context
from orchestrator.domain import FailedPrecondition, InvalidArgument, NotFound, TemporaryError
from protos.shared.pump import CHUNK, pump

log = logging.getLogger(__name__)

ORCHESTRATOR = "app.kubernetes.io/part-of=stasis,app.kubernetes.io/component=orchestrator"


@dataclass
class Discovered:
    """An orchestrator reached through a port-forward; `context` is what a client connects with."""

    context: Context
    forward: PortForward

    def close(self) -> None:
        self.forward.close()


def discover(namespace: str = "", kube_context: str = "") -> Discovered:
    """The orchestrator of the one Stasis release in `namespace` (default: the kube context's)."""
    try:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=kube_context or None)
        contexts, current = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
    except (config.ConfigException, OSError) as exc:
        raise InvalidArgument(
            "kubeconfig", f"cannot be read ({exc}); give --addr or fix KUBECONFIG"
        ) from None
    chosen = next((c for c in contexts if c["name"] == kube_context), current) if kube_context else current
    namespace = namespace or (chosen.get("context") or {}).get("namespace") or "default"
    api = client.CoreV1Api()
    where = f"namespace {namespace} of Kubernetes context {chosen['name']}"
    try:
        service = _one_service(api, namespace, where)
        pod, port = _ready_pod(api, service, namespace)
        secrets = api.list_namespaced_secret(namespace, label_selector=_release_selector(service)).items
    except ApiException as exc:
        raise TemporaryError(f"the Kubernetes API refused or failed: {exc.status} {exc.reason}") from None
    ca, token = _credential(secrets)
    forward = PortForward(api, namespace, pod, port)
    ca_file = None
    if ca:
        private = tempfile.mkdtemp(prefix="stasis-kube-")
        atexit.register(shutil.rmtree, private, True)
        ca_file = Path(private) / "ca.crt"
        ca_file.write_bytes(ca)
    log.info("reaching %s/%s through pod %s port %d", namespace, service.metadata.name, pod, port)
    return Discovered(
        Context(name=chosen["name"], server=forward.address, certificate_authority=ca_file, token=token),
        forward,
    )


def _release_selector(service: Any) -> str:
    instance = (service.metadata.labels or {}).get("app.kubernetes.io/instance", "")
    return f"app.kubernetes.io/part-of=stasis,app.kubernetes.io/instance={instance}"


def _one_service(api: client.CoreV1Api, namespace: str, where: str) -> Any:
    services: list[Any] = api.list_namespaced_service(namespace, label_selector=ORCHESTRATOR).items
    if not services:
        raise NotFound(f"no Stasis orchestrator Service in {where}; give -n NAMESPACE or --addr")
    if len(services) > 1:
        names = sorted(s.metadata.name for s in services)
        raise FailedPrecondition(
            f"{len(services)} Stasis releases in {where} ({', '.join(names)}); give --addr"
        )
    return services[0]


def _ready_pod(api: client.CoreV1Api, service: Any, namespace: str) -> tuple[str, int]:
    """A running, ready pod behind the Service, and the container port its `grpc` port targets."""
    name = service.metadata.name
    grpc_port = next((p for p in service.spec.ports or [] if p.name == "grpc"), None)
    if grpc_port is None:
        raise FailedPrecondition(f"Service {namespace}/{name} has no port named grpc")
    selector = ",".join(f"{k}={v}" for k, v in sorted((service.spec.selector or {}).items()))
    pods: list[Any] = api.list_namespaced_pod(namespace, label_selector=selector).items
    for pod in pods:
        ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        if pod.status.phase != "Running" or not ready or pod.metadata.deletion_timestamp:
            continue
        target = grpc_port.target_port or grpc_port.port
        if isinstance(target, int) or str(target).isdigit():
            return str(pod.metadata.name), int(target)
        for container in pod.spec.containers:
            for p in container.ports or []:
                if p.name == target:
                    return str(pod.metadata.name), int(p.container_port)
        raise FailedPrecondition(f"pod {namespace}/{pod.metadata.name} has no container port named {target}")
    raise TemporaryError(f"no ready orchestrator pod behind Service {namespace}/{name}")


def _credential(secrets: list[Any]) -> tuple[bytes, str]:
    """The cluster CA certificate and the operator token of the release, where it has them."""
    ca, token = b"", ""
    for secret in secrets:
        data = secret.data or {}
        if "ca.crt" in data and not ca:
            ca = base64.b64decode(data["ca.crt"])
        if "token" in data and not token:
            token = base64.b64decode(data["token"]).decode().strip()
    return ca, token


class PortForward:
    """A loopback listener whose every connection is carried to the pod's port by its own
    port-forward stream, as `kubectl port-forward` does; one event loop on a thread of its own
    carries them all."""

    def __init__(self, api: client.CoreV1Api, namespace: str, pod: str, port: int) -> None:
        self.api, self.namespace, self.pod, self.port = api, namespace, pod, port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-port-forward", daemon=True)
        self._thread.start()

        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._carry, sock=self._listener, limit=CHUNK)

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=10)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            stream = await asyncio.to_thread(
                portforward,
                self.api.connect_get_namespaced_pod_portforward,
                self.pod,
                self.namespace,
                ports=str(self.port),
            )
        except ApiException as exc:
            log.warning("port-forward to %s/%s failed: %s", self.namespace, self.pod, exc.reason)
            writer.close()
            return
        remote = await asyncio.open_connection(sock=stream.socket(self.port), limit=CHUNK)
        await pump((reader, writer), remote)

    def close(self) -> None:
        """Stop listening and end the connections being carried."""
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            self._server.close()
            carried = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in carried:
                task.cancel()
            await asyncio.gather(*carried, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._listener.close()
        if not self._loop.is_running():
            self._loop.close()
