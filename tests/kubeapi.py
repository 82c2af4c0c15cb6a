"""A stand-in for the Kubernetes API server, over real HTTP, for what Stasis asks of it.

No Kubernetes API server can run on these machines. This stand-in answers the few calls Stasis
makes, in the API's own JSON, so the real `kubernetes` client is what the tests drive:

* `POST /apis/authentication.k8s.io/v1/tokenreviews`: a token it was told of is a service
  account's, bound to a pod; any other is not authenticated;
* `GET /api/v1/namespaces/{ns}/pods/{name}`: the pods it was told of, or a 404 Status.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Pod:
    namespace: str
    name: str
    node: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class StandInApiServer:
    """Tokens (a token -> the service account and pod it was issued to) and pods, served on loopback."""

    tokens: dict[str, tuple[str, Pod]] = field(default_factory=dict)
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/apis/authentication.k8s.io/v1/tokenreviews":
                    return self._send(404, _status(404, f"no route {self.path}"))
                api.reviews.append(body)
                self._send(201, api.review(body))

            def do_GET(self) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                    pod = api.pods.get((parts[3], parts[5]))
                    if pod is None:
                        return self._send(404, _status(404, f'pods "{parts[5]}" not found'))
                    return self._send(200, _pod(pod))
                self._send(404, _status(404, f"no route {self.path}"))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_pod(self, namespace: str, name: str, node: str) -> Pod:
        pod = Pod(namespace, name, node)
        self.pods[(namespace, name)] = pod
        return pod

    def issue_token(self, service_account: str, pod: Pod) -> str:
        """A projected token of `service_account` (NAMESPACE:NAME) bound to `pod`."""
        token = f"token-{uuid.uuid4().hex}"
        self.tokens[token] = (service_account, pod)
        return token

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec") or {}
        found = self.tokens.get(spec.get("token", ""))
        status: dict[str, Any]
        if found is None:
            status = {"authenticated": False, "error": "invalid bearer token"}
        else:
            account, pod = found
            namespace, _, name = account.partition(":")
            status = {
                "authenticated": True,
                "audiences": spec.get("audiences") or [],
                "user": {
                    "username": f"system:serviceaccount:{namespace}:{name}",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, account)),
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "extra": {
                        "authentication.kubernetes.io/pod-name": [pod.name],
                        "authentication.kubernetes.io/pod-uid": [pod.uid],
                    },
                },
            }
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
            "status": status,
        }

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that points the real client at this stand-in."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "orchestrator", "user": {"token": "orchestrator-token"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "orchestrator"}}],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config))
        return path

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _pod(pod: Pod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "spec": {"nodeName": pod.node, "containers": [{"name": "agent", "image": "stasis"}]},
        "status": {"phase": "Running"},
    }


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": code,
            "reason": "NotFound" if code == 404 else "BadRequest"}  # fmt: skip
