"""A stand-in for the Kubernetes API server, over real HTTP, for what Stasis asks of it.

No Kubernetes API server can run on these machines. This stand-in answers the few calls Stasis
makes, in the API's own JSON, so the real `kubernetes` client is what the tests drive:

* `POST /apis/authentication.k8s.io/v1/tokenreviews`: a token it was told of is a service
  account's, bound to a pod; any other is not authenticated;
* `GET /api/v1/namespaces/{ns}/pods/{name}`: the pods it was told of, or a 404 Status;
* `GET /api/v1/namespaces/{ns}/{services,pods,secrets}?labelSelector=k=v,...`: the objects it
  was given as manifests, filtered by equality selectors, and the pods it was told of (which
  carry no labels); `fieldSelector=spec.nodeName=N` keeps a node's pods;
* `GET /api/v1/nodes`: its nodes, and `GET /api/v1/nodes/{name}` one of them, or a 404 Status;
* `GET /api/v1/namespaces/{ns}/pods/{name}/portforward?ports=N` upgraded to a WebSocket
  (`v4.channel.k8s.io`, as the API server speaks it): the port's data channel carried to a
  loopback port the test named for that pod and port.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Pod:
    namespace: str
    name: str
    node: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ip: str = "127.0.0.1"
    """Its status.podIP: loopback, where the tests' agents listen."""
    service_account: str = "stasis-agent"


@dataclass
class StandInApiServer:
    """Tokens (a token -> the service account and pod it was issued to) and pods, served on loopback."""

    tokens: dict[str, tuple[str, Pod]] = field(default_factory=dict)
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Manifests by plural kind ("services", "pods", "secrets"), listed by label selector."""
    forwards: dict[tuple[str, str, int], int] = field(default_factory=dict)
    """(namespace, pod, port) -> the loopback port a port-forward to it reaches."""
    audience_aware: bool = True
    """False: token reviews name no audience, as an authenticator that ignores them answers."""
    review_delay_s: float = 0.0
    """How long each token review takes to answer (a slow or stuck API server)."""

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
                time.sleep(api.review_delay_s)
                self._send(201, api.review(body))

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts, query = url.path.strip("/").split("/"), parse_qs(url.query)
                if parts == ["api", "v1", "nodes"]:
                    nodes = api.objects.get("nodes", [])
                    return self._send(
                        200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}
                    )
                if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                    named = [n for n in api.objects.get("nodes", []) if n["metadata"]["name"] == parts[3]]
                    if not named:
                        return self._send(404, _status(404, f'nodes "{parts[3]}" not found'))
                    return self._send(200, named[0])
                if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5:
                    return self._send(404, _status(404, f"no route {self.path}"))
                namespace, plural = parts[3], parts[4]
                if len(parts) == 5:
                    selector = (query.get("labelSelector") or [""])[0]
                    objects = api.objects.get(plural, [])
                    if plural == "pods":
                        objects = [*objects, *(_pod(p) for p in api.pods.values())]
                    items = [o for o in objects if _selected(o, namespace, selector)]
                    on = (query.get("fieldSelector") or [""])[0].removeprefix("spec.nodeName=")
                    items = [o for o in items if not on or o.get("spec", {}).get("nodeName") == on]
                    kind = {"services": "ServiceList", "pods": "PodList", "secrets": "SecretList"}.get(plural)
                    if kind is None:
                        return self._send(404, _status(404, f"no route {self.path}"))
                    return self._send(200, {"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items})
                if len(parts) == 7 and plural == "pods" and parts[6] == "portforward":
                    return self._port_forward(namespace, parts[5], int((query.get("ports") or ["0"])[0]))
                if len(parts) == 6 and plural == "pods":
                    pod = api.pods.get((namespace, parts[5]))
                    if pod is None:
                        return self._send(404, _status(404, f'pods "{parts[5]}" not found'))
                    return self._send(200, _pod(pod))
                self._send(404, _status(404, f"no route {self.path}"))

            def _port_forward(self, namespace: str, pod: str, port: int) -> None:
                target = api.forwards.get((namespace, pod, port))
                if target is None or self.headers.get("Upgrade", "").lower() != "websocket":
                    return self._send(404, _status(404, f"no port-forward to {namespace}/{pod}:{port}"))
                key = self.headers["Sec-WebSocket-Key"]
                accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
                self.send_response(101, "Switching Protocols")
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", accept)
                self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
                self.end_headers()
                self.wfile.flush()
                api.port_forwards += 1
                upstream = socket.create_connection(("127.0.0.1", target))
                # Each channel's first frame names its port: data on channel 0, errors on 1.
                for channel in (0, 1):
                    self.connection.sendall(_ws_frame(bytes([channel]) + struct.pack("<H", port)))
                threading.Thread(target=self._to_pod, args=(upstream,), daemon=True).start()
                try:
                    while data := upstream.recv(1 << 16):
                        self.connection.sendall(_ws_frame(b"\x00" + data))
                    self.connection.sendall(_ws_frame(b"", opcode=0x8))
                except OSError:
                    pass
                finally:
                    upstream.close()
                    self.close_connection = True

            def _to_pod(self, upstream: socket.socket) -> None:
                try:
                    while (frame := _ws_read(self.rfile)) is not None:
                        opcode, payload = frame
                        if opcode == 0x8:
                            break
                        if opcode == 0x2 and payload[:1] == b"\x00":
                            upstream.sendall(payload[1:])
                except OSError:
                    pass
                finally:
                    with contextlib.suppress(OSError):
                        upstream.shutdown(socket.SHUT_RDWR)

        self.port_forwards = 0
        """How many port-forward streams were opened."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
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
                "audiences": (spec.get("audiences") or []) if self.audience_aware else [],
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

    def add(self, plural: str, manifest: dict[str, Any]) -> None:
        self.objects.setdefault(plural, []).append(manifest)

    def put(self, plural: str, manifest: dict[str, Any]) -> None:
        """Add the object, or replace the one of the same namespace and name."""
        key = (manifest["metadata"].get("namespace"), manifest["metadata"]["name"])
        kept = [
            o
            for o in self.objects.get(plural, [])
            if (o["metadata"].get("namespace"), o["metadata"]["name"]) != key
        ]
        self.objects[plural] = [*kept, manifest]

    def remove(self, plural: str, namespace: str | None, name: str) -> None:
        self.objects[plural] = [
            o for o in self.objects.get(plural, [])
            if (o["metadata"].get("namespace"), o["metadata"]["name"]) != (namespace, name)
        ]  # fmt: skip

    def client(self) -> Any:
        """The real `kubernetes` client's CoreV1Api, pointed at this stand-in."""
        from kubernetes import client

        return client.CoreV1Api(client.ApiClient(client.Configuration(host=self.url)))

    def kubeconfig(self, path: Path, namespace: str = "") -> Path:
        """A kubeconfig that points the real client at this stand-in."""
        context = {
            "cluster": "stand-in",
            "user": "orchestrator",
            **({"namespace": namespace} if namespace else {}),
        }
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "orchestrator", "user": {"token": "orchestrator-token"}}],
            "contexts": [{"name": "stand-in", "context": context}],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config))
        return path

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _selected(manifest: dict[str, Any], namespace: str, selector: str) -> bool:
    labels = manifest.get("metadata", {}).get("labels") or {}
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    in_namespace = manifest.get("metadata", {}).get("namespace") == namespace
    return in_namespace and all(labels.get(k) == v for k, v in wanted.items())


def _ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One unmasked, final frame, as a server sends it."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def _ws_read(stream: Any) -> tuple[int, bytes] | None:
    """One frame from the client (masked, as clients must); None at the end of the stream."""
    head = stream.read(2)
    if len(head) < 2:
        return None
    opcode, length = head[0] & 0x0F, head[1] & 0x7F
    if length == 126:
        length = struct.unpack("!H", stream.read(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", stream.read(8))[0]
    mask = stream.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    payload = stream.read(length)
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _pod(pod: Pod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "spec": {
            "nodeName": pod.node,
            "serviceAccountName": pod.service_account,
            "containers": [{"name": "agent", "image": "stasis"}],
        },
        "status": {"phase": "Running", "podIP": pod.ip, "podIPs": [{"ip": pod.ip}]},
    }


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": code,
            "reason": "NotFound" if code == 404 else "BadRequest"}  # fmt: skip
