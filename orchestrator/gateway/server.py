"""The inference gateway: the harness's only model endpoint and the ledger's only writer.

Each request is authenticated by its episode's token, answered from the ledger if it repeats a
recorded turn, and otherwise forwarded upstream with per-token log-probs and token ids requested.
The turn is committed to the ledger before a single response byte goes back to the harness, and
the upstream's bytes are returned unchanged.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.domain import Episode
from orchestrator.gateway.canonical import CanonicalRequest, canonical_message
from orchestrator.gateway.ledger import Ledger

log = logging.getLogger(__name__)

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
MAX_BODY = 64 << 20


@dataclass(frozen=True)
class Upstream:
    """An OpenAI-compatible model server."""

    base_url: str
    """The server's OpenAI base URL, e.g. http://vllm:8000/v1; a URL without the /v1 gets it."""
    api_key: str = ""
    timeout_s: float = 600.0

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        base = self.base_url.rstrip("/")
        url = urllib.parse.urlsplit((base if base.endswith("/v1") else base + "/v1") + path)
        conn_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = conn_type(url.hostname or "127.0.0.1", url.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn.request("POST", url.path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()


class GatewayError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class Sampled:
    """What the upstream said, as the ledger records it."""

    answer: Any
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int]
    policy_version: str


def read_sample(kind: str, headers: dict[str, str], body: bytes) -> Sampled:
    """Pull token ids, log-probs and the answer out of an upstream response, never re-tokenising."""
    data = json.loads(body)
    choice = data["choices"][0]
    if kind == "chat":
        answer: Any = canonical_message(choice.get("message") or {})
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(e["logprob"]) for e in entries]
        tokens = [e.get("token", "") for e in entries]
    else:
        answer = choice.get("text") or ""
        lp = choice.get("logprobs") or {}
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        tokens = lp.get("tokens") or []
    token_ids = choice.get("token_ids")
    if token_ids is None and tokens and all(str(t).startswith("token_id:") for t in tokens):
        token_ids = [int(str(t).split(":", 1)[1]) for t in tokens]
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    version = headers.get("x-policy-version") or data.get("system_fingerprint") or data.get("model") or ""
    return Sampled(
        answer, [int(t) for t in token_ids or []], logprobs, [int(t) for t in prompt_ids], str(version)
    )


class Gateway:
    """Serves the OpenAI-compatible routes for every episode's sandbox."""

    def __init__(
        self,
        listen: str,
        ledger: Ledger,
        episodes: Callable[[str], Episode | None],
        resumed_after: Callable[[Episode], int],
        upstream: Upstream,
    ) -> None:
        self.ledger = ledger
        self.episodes = episodes
        self.resumed_after = resumed_after
        self.upstream = upstream
        self._inflight: dict[tuple[str, str], Future[tuple[int, bytes]]] = {}
        self._lock = threading.Lock()
        host, _, port = listen.rpartition(":")
        handler = type("GatewayHandler", (_Handler,), {"gateway": self})
        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="gateway", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Gateway:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def authenticate(self, authorization: str) -> Episode:
        token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
        episode = self.episodes(token) if token else None
        if episode is None:
            raise GatewayError(
                401,
                "missing or unknown API key: use the OPENAI_API_KEY of this sandbox",
                "authentication_error",
            )
        if episode.state.terminal:
            raise GatewayError(403, f"episode {episode.id} has ended ({episode.state})", "permission_error")
        return episode

    def complete(self, episode: Episode, kind: str, path: str, raw: bytes) -> tuple[int, bytes, str]:
        """Answer one request; returns status, body and how it was served (replay|sampled)."""
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise GatewayError(400, f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "request body must be a JSON object")
        if body.get("stream"):
            raise GatewayError(
                400, "stream: streaming is not supported by the Stasis gateway; set stream to false"
            )
        if body.get("n", 1) != 1:
            raise GatewayError(400, "n: the Stasis gateway samples one choice per request")
        try:
            request = CanonicalRequest.parse(kind, body)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None

        recorded = self.ledger.replay(episode.id, request)
        if recorded is not None:
            return 200, recorded.response, "replay"
        key = (episode.id, request.fingerprint)
        with self._lock:
            pending = self._inflight.get(key)
            owner = pending is None
            if owner:
                pending = self._inflight[key] = Future()
        assert pending is not None
        if not owner:
            # The same request is already with the upstream (a retry of an in-flight request):
            # it gets the same recorded answer, not a second sample.
            status, response = pending.result()
            recorded = self.ledger.replay(episode.id, request)  # counts this delivery as a replay
            return (200, recorded.response, "replay") if recorded else (status, response, "replay")
        try:
            status, response = self._sample(episode, kind, path, raw, body, request)
            pending.set_result((status, response))
            return status, response, "sampled"
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _sample(
        self,
        episode: Episode,
        kind: str,
        path: str,
        raw: bytes,
        body: dict[str, Any],
        request: CanonicalRequest,
    ) -> tuple[int, bytes]:
        forwarded = dict(body)
        forwarded["return_token_ids"] = True
        if kind == "chat":
            forwarded["logprobs"] = True
        elif not isinstance(forwarded.get("logprobs"), int) or forwarded["logprobs"] < 1:
            forwarded["logprobs"] = 1
        started = time.monotonic()
        try:
            status, headers, response = self.upstream.post(path, json.dumps(forwarded).encode())
        except OSError as exc:
            raise GatewayError(
                502, f"model server {self.upstream.base_url} unreachable: {exc}", "upstream_error"
            ) from None
        upstream_ms = (time.monotonic() - started) * 1000
        if status != 200:
            return status, response  # the harness sees the model server's own error; nothing is recorded
        try:
            sampled = read_sample(kind, headers, response)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise GatewayError(
                502, f"model server returned a response without choices: {exc}", "upstream_error"
            ) from None
        if not sampled.token_ids or len(sampled.token_ids) != len(sampled.logprobs):
            raise GatewayError(
                502,
                f"model server returned {len(sampled.token_ids)} token ids and {len(sampled.logprobs)} log-probs; "
                "Stasis records both per token (vLLM: return_token_ids)",
                "upstream_error",
            )
        self.ledger.record(
            episode.id,
            episode.runs,
            self.resumed_after(episode),
            request,
            raw,
            sampled.answer,
            response,
            sampled.token_ids,
            sampled.logprobs,
            sampled.prompt_token_ids,
            sampled.policy_version,
            upstream_ms,
        )
        return status, response


class _Handler(BaseHTTPRequestHandler):
    gateway: Gateway
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gateway %s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: GatewayError) -> None:
        body = json.dumps({"error": {"message": str(err), "type": err.kind, "code": err.status}}).encode()
        self._send(err.status, body)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            models = {
                "object": "list",
                "data": [{"id": "stasis-gateway", "object": "model", "owned_by": "stasis"}],
            }
            self._send(200, json.dumps(models).encode())
        else:
            self._error(GatewayError(404, f"{self.path} is not served by the Stasis gateway"))

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path.rstrip("/")
        kind = ROUTES.get(path)
        try:
            if kind is None:
                raise GatewayError(404, f"{path} is not served; use /v1/chat/completions or /v1/completions")
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                raise GatewayError(
                    411 if length <= 0 else 413, "a JSON body with a Content-Length is required"
                )
            raw = self.rfile.read(length)
            episode = self.gateway.authenticate(self.headers.get("Authorization", ""))
            status, body, served = self.gateway.complete(episode, kind, path.removeprefix("/v1"), raw)
        except GatewayError as err:
            self._error(err)
            return
        except Exception:
            log.exception("gateway failed on %s", path)
            self._error(GatewayError(500, "internal gateway error", "server_error"))
            return
        # Recorded first, delivered now: if the harness is gone (frozen, restored elsewhere),
        # its retry is answered from the ledger.
        try:
            self._send(status, body)
        except OSError:
            log.info("harness of %s went away before its %s response was delivered", episode.id, served)
