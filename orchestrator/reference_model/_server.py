"""The reference model over HTTP: a standard-library threading server, runnable in-process on a thread."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from orchestrator.reference_model._model import ChatAnswer, ReferenceModel
from orchestrator.reference_model._protocol import ApiError
from orchestrator.reference_model._settings import ReferenceModelSettings
from orchestrator.reference_model._streaming import chat_chunks, completion_chunks, generate_chunks

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Long agent conversations are large, but a body beyond this is a client bug, not a prompt."""
POLICY_VERSION_HEADER = "x-policy-version"


class _ModelHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], model: ReferenceModel, access_log: bool) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.model = model
        self.access_log = access_log
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        self.streams_begun = 0
        """Streamed answers begun (counted before their first byte)."""
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections[request] = threading.current_thread()
        try:
            super().finish_request(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)

    def close_connections(self) -> list[threading.Thread]:
        """Shut down open keep-alive connections; returns their handler threads, which now end promptly."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        return [thread for _, thread in connections]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-response (a frozen sandbox, a dropping proxy) is routine here.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stasis-reference-model/1"
    # Idle keep-alive connections are closed after this many seconds.
    timeout = 120
    # Headers and body go out as separate writes; with Nagle on, delayed ACKs add ~40 ms per response.
    disable_nagle_algorithm = True
    server: _ModelHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            super().log_message(format, *args)

    def _send_json(self, status: int, payload: Mapping[str, Any], policy_version: str | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(POLICY_VERSION_HEADER, policy_version or self.server.model.policy_version)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: ApiError) -> None:
        self._send_json(error.status, error.body())

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        model = self.server.model
        if path == "/health":
            self._send_json(200, {"status": "ok", "policy_version": model.policy_version})
        elif path == "/v1/models":
            entry = {"id": model.settings.model_name, "object": "model", "created": 0, "owned_by": "stasis"}
            self._send_json(200, {"object": "list", "data": [entry]})
        else:
            self._send_error(ApiError(404, f"no route for GET {path}", None, "not_found_error"))

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        model = self.server.model
        routes: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "/v1/chat/completions": model.chat_answer,
            "/v1/completions": model.completion,
            "/generate": model.generate,
            "/tokenize": model.tokenize,
        }
        route = routes.get(path)
        try:
            body = self._read_json()
            if route is None:
                raise ApiError(404, f"no route for POST {path}", None, "not_found_error")
            stream, include_usage, token_ids = _streaming_options(body)
            if stream:
                # Generated whole (sampling is cheap here), then sent token by token.
                body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
                body["return_token_ids"] = True
                if path == "/generate":
                    body["return_logprob"] = True
            answer = route(body)
        except ApiError as error:
            self._send_error(error)
            return
        except Exception as error:
            traceback.print_exc()
            self._send_error(ApiError(500, f"reference model failed: {error!r}", None, "server_error"))
            return
        response = answer.response if isinstance(answer, ChatAnswer) else answer
        if stream:
            with self.server._connections_lock:
                self.server.streams_begun += 1
        version = response.get("system_fingerprint") or response.get("meta_info", {}).get("weight_version")
        if not stream:
            self._send_json(200, response, version)
        elif isinstance(answer, ChatAnswer):
            self._send_stream(chat_chunks(answer, token_ids=token_ids, include_usage=include_usage), version)
        elif path == "/generate":
            self._send_stream(generate_chunks(response, body), version)
        else:
            chunks = completion_chunks(
                model.vocabulary, response, token_ids=token_ids, include_usage=include_usage
            )
            self._send_stream(chunks, version)

    def _send_stream(self, chunks: Iterator[dict[str, Any]], policy_version: str | None) -> None:
        """Server-sent events in chunked transfer encoding, so the connection stays reusable."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header(POLICY_VERSION_HEADER, policy_version or self.server.model.policy_version)
        self.end_headers()
        delay = self.server.model.settings.stream_token_delay_s
        for i, chunk in enumerate([*chunks, None]):
            if i and delay:
                time.sleep(delay)
            event = b"data: [DONE]\n\n" if chunk is None else b"data: " + json.dumps(chunk).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _read_json(self) -> Mapping[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise ApiError(411, "a Content-Length header is required (chunked bodies are not supported)")
        try:
            size = int(length)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, f"bad Content-Length {length!r}") from None
        if not 0 <= size <= MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, f"body of {size} bytes exceeds {MAX_BODY_BYTES}")
        raw = self.rfile.read(size)
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ApiError(400, f"request body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body


def _streaming_options(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """Whether to stream, whether to end with a usage chunk, and whether chunks carry token ids."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream: must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options: must be an object", "stream_options")
    return (
        stream,
        bool(options.get("include_usage")),
        bool(body.get("return_token_ids") or body.get("return_logprob")),
    )


class ReferenceModelServer:
    """The reference model's HTTP server on a background thread: start(), url, stop()."""

    def __init__(
        self, settings: ReferenceModelSettings | None = None, model: ReferenceModel | None = None
    ) -> None:
        self.settings = settings or ReferenceModelSettings()
        self.model = model or ReferenceModel(self.settings)
        self._httpd: _ModelHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ReferenceModelServer:
        """Bind and start serving; returns self so `server = ReferenceModelServer(...).start()` reads well."""
        if self._httpd is not None:
            raise RuntimeError("reference model server already started")
        httpd = _ModelHTTPServer(
            (self.settings.host, self.settings.port), self.model, self.settings.access_log
        )
        thread = threading.Thread(target=httpd.serve_forever, name="reference-model", daemon=True)
        thread.start()
        self._httpd, self._thread = httpd, thread
        return self

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        if self._httpd is None:
            raise RuntimeError("reference model server is not started")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def streams_begun(self) -> int:
        """How many streamed answers the server has begun: a generation a client watches arrive."""
        return self._httpd.streams_begun if self._httpd is not None else 0

    @property
    def url(self) -> str:
        """The OpenAI base URL, ending in /v1."""
        host, port = self.address
        return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close the listening socket and any open connections."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._httpd = self._thread = None
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout)
        for handler in httpd.close_connections():
            handler.join(timeout)

    def __enter__(self) -> ReferenceModelServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
