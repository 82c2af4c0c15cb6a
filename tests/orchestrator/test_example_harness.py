"""The example harness against the reference model: full episodes, and resends across dropped connections.

The harness runs as a plain subprocess with ``python -I -S`` (no site-packages:
it must live on the standard library alone, as it does in the sandbox). A
small TCP relay between it and the model records every request and injects
the failures a preemption causes: a connection reset after the request was
forwarded, a response cut off half-way, a 5xx and a 4xx.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings

AGENT = Path(__file__).resolve().parents[2] / "examples" / "harness" / "agent.py"
PRODUCT = re.compile(r"^python3 -c 'print\((\d+)\*(\d+)\)'$")


def read_http_message(sock: socket.socket) -> tuple[bytes, bytes]:
    """Headers and body of one HTTP message with a Content-Length (what urllib and our server send)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"peer closed after {len(data)} header bytes")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    length = int(match.group(1)) if match else 0
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("peer closed mid-body")
        body += chunk
    return head, body


@dataclass
class Exchange:
    """One connection through the relay: the request body, the fault applied and the response body relayed."""

    request: bytes
    fault: str
    response: bytes = b""


@dataclass
class FaultyRelay:
    """A TCP relay to the model that applies faults[i] to the i-th connection ("pass" once they run out).

    Faults: "pass"; "reset" (forward the request, then reset the client before any
    response, like a sandbox frozen mid-request); "close" (the same with a plain
    close); "truncate" (relay half the response, then close); "503"/"400"
    (answer that status without forwarding).
    """

    upstream: tuple[str, int]
    faults: list[str]
    port: int = 0
    exchanges: list[Exchange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="faulty-relay", daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        index = 0
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            fault = self.faults[index] if index < len(self.faults) else "pass"
            index += 1
            worker = threading.Thread(target=self._serve, args=(client, fault), daemon=True)
            self._workers.append(worker)
            worker.start()

    def _serve(self, client: socket.socket, fault: str) -> None:
        with client:
            client.settimeout(30)
            head, body = read_http_message(client)
            exchange = Exchange(body, fault)
            with self._lock:
                self.exchanges.append(exchange)
            if fault in ("503", "400"):
                payload = json.dumps({"error": {"message": f"injected {fault}", "type": "x"}}).encode()
                client.sendall(
                    f"HTTP/1.1 {fault} Injected\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )
                return
            with socket.create_connection(self.upstream, timeout=30) as upstream:
                upstream.sendall(head + b"\r\n\r\n" + body)
                response_head, response_body = read_http_message(upstream)
            exchange.response = response_body
            if fault == "reset":
                # SO_LINGER 0 makes close() send RST: the client sees ECONNRESET, as after a restore.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if fault == "close":
                return
            if fault == "truncate":
                client.sendall(response_head + b"\r\n\r\n" + response_body[: len(response_body) // 2])
                return
            client.sendall(response_head + b"\r\n\r\n" + response_body)

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._acceptor.join(5)
        for worker in self._workers:
            worker.join(5)


@pytest.fixture(scope="module")
def model() -> Iterator[ReferenceModelServer]:
    with ReferenceModelServer(ReferenceModelSettings(seed=21, mean_tool_turns=4)) as server:
        yield server


@pytest.fixture
def relay_factory(model: ReferenceModelServer) -> Iterator[Any]:
    relays: list[FaultyRelay] = []

    def make(faults: list[str]) -> FaultyRelay:
        relay = FaultyRelay(model.address, faults)
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.stop()


@dataclass
class HarnessRun:
    returncode: int
    log: str
    workdir: Path


def start_harness(base_url: str, tmp_path: Path, **env: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start the harness as the sandbox would, stdout to a log file; returns the process, log and workdir."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    workdir = tmp_path / "work"
    task = tmp_path / "task.txt"
    task.write_text("Keep notes in notes.txt and report.")
    log_path = tmp_path / "harness.log"
    environ = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "test-key",
        "STASIS_MODEL": "reference",
        "HARNESS_WORKDIR": str(workdir),
        "HARNESS_TASK_FILE": str(task),
        "HARNESS_RETRY_DELAY": "0.01",
        **env,
    }
    # The sandbox sends harness stdout to a file; do the same.
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(AGENT)], env=environ, stdout=log, stderr=subprocess.STDOUT
        )
    return proc, log_path, workdir


def finish_harness(
    proc: subprocess.Popen[bytes], log_path: Path, workdir: Path, timeout: float = 90
) -> HarnessRun:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return HarnessRun(proc.returncode, log_path.read_text(), workdir)


def run_harness(base_url: str, tmp_path: Path, **env: str) -> HarnessRun:
    return finish_harness(*start_harness(base_url, tmp_path, **env))


def request_of(exchange: Exchange) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exchange.request)
    return body


@pytest.mark.timeout(120)
def test_harness_runs_an_episode_to_an_answer(relay_factory: Any, tmp_path: Path) -> None:
    relay = relay_factory([])
    run = run_harness(relay.url, tmp_path)
    assert run.returncode == 0, run.log
    turns = [line for line in run.log.splitlines() if line.startswith("turn ")]
    assert turns[-1].startswith(f"turn {len(turns)}: answer"), run.log
    assert all(re.match(rf"turn {i + 1}: tool (shell|write_file)", t) for i, t in enumerate(turns[:-1])), (
        run.log
    )
    assert len(turns) >= 2, "the episode should call at least one tool"
    progress = json.loads((run.workdir / "progress.json").read_text())
    assert progress["turn"] == len(turns) and progress["status"] == "answered"
    assert len(relay.exchanges) == len(turns)

    responses = [json.loads(e.response)["choices"][0]["message"] for e in relay.exchanges]
    assert (run.workdir / "answer.txt").read_text() == responses[-1]["content"]
    final = request_of(relay.exchanges[-1])
    assert final["model"] == "reference" and {t["function"]["name"] for t in final["tools"]} == {
        "shell",
        "write_file",
    }
    messages = final["messages"]
    # Each assistant message goes back exactly as the model returned it, followed by its tool results.
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert assistant == responses[:-1]
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    calls = [c for m in assistant for c in m["tool_calls"]]
    assert len(results) == len(calls) == progress["tool_calls"]
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        result = results[call["id"]]
        if call["function"]["name"] == "write_file":
            assert result == f"wrote {len(arguments['content'].encode())} bytes to {arguments['path']}"
            assert (run.workdir / arguments["path"]).exists()
        else:
            assert re.match(r"exit code \d+\n", result), result
            product = PRODUCT.match(arguments["command"])
            if product:
                assert result == f"exit code 0\n{int(product[1]) * int(product[2])}\n"


@pytest.mark.timeout(120)
def test_harness_resends_the_same_request_after_dropped_connections(
    relay_factory: Any, tmp_path: Path
) -> None:
    relay = relay_factory(["reset", "pass", "truncate", "close", "pass"])
    run = run_harness(relay.url, tmp_path)
    assert run.returncode == 0, run.log
    retries = [line for line in run.log.splitlines() if ": retry " in line]
    assert len(retries) == 3, run.log
    assert retries[0].startswith("turn 1:") and "ConnectionResetError" in retries[0]
    assert retries[1].startswith("turn 2:") and "IncompleteRead" in retries[1]
    assert retries[2].startswith("turn 2:") and "RemoteDisconnected" in retries[2]
    faults = [e.fault for e in relay.exchanges]
    assert faults[:5] == ["reset", "pass", "truncate", "close", "pass"]
    # The dropped request reached the model, and the resend carried the very same bytes.
    assert relay.exchanges[0].response
    assert relay.exchanges[0].request == relay.exchanges[1].request
    assert relay.exchanges[2].request == relay.exchanges[3].request == relay.exchanges[4].request
    assert relay.exchanges[1].request != relay.exchanges[2].request
    assert json.loads((run.workdir / "progress.json").read_text())["status"] == "answered"
    assert (run.workdir / "answer.txt").read_text()


@pytest.mark.timeout(120)
def test_harness_waits_for_an_unreachable_endpoint(model: ReferenceModelServer, tmp_path: Path) -> None:
    """Right after a restore the gateway may not answer yet: connection refused is retried until it does."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc, log_path, workdir = start_harness(f"http://127.0.0.1:{port}/v1", tmp_path)
    relay = None
    try:
        deadline = time.monotonic() + 30
        while "Connection refused" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        relay = FaultyRelay(model.address, [], port=port)
        run = finish_harness(proc, log_path, workdir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if relay is not None:
            relay.stop()
    assert run.returncode == 0, run.log
    assert json.loads((workdir / "progress.json").read_text())["status"] == "answered"


@pytest.mark.timeout(120)
def test_harness_retries_server_errors_a_few_times(relay_factory: Any, tmp_path: Path) -> None:
    relay = relay_factory(["503", "503"])
    run = run_harness(relay.url, tmp_path)
    assert run.returncode == 0, run.log
    assert run.log.count("after HTTP 503") == 2
    assert relay.exchanges[0].request == relay.exchanges[2].request

    failing = relay_factory(["503"] * 10)
    run = run_harness(failing.url, tmp_path / "failing", HARNESS_SERVER_RETRIES="2")
    assert run.returncode == 3, run.log
    assert len(failing.exchanges) == 3
    assert json.loads((run.workdir / "progress.json").read_text())["status"] == "endpoint_failing"


@pytest.mark.timeout(60)
def test_harness_gives_up_on_a_refusal(relay_factory: Any, tmp_path: Path) -> None:
    relay = relay_factory(["400"])
    run = run_harness(relay.url, tmp_path)
    assert run.returncode == 2, run.log
    assert "HTTP 400" in run.log
    assert len(relay.exchanges) == 1
    assert not (run.workdir / "answer.txt").exists()


@pytest.mark.timeout(60)
def test_harness_sends_the_api_key(relay_factory: Any, tmp_path: Path) -> None:
    """The bearer token reaches the endpoint; captured at the relay since the model ignores it."""
    captured: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def answer_once() -> None:
        client, _ = listener.accept()
        with client:
            head, _ = read_http_message(client)
            captured.append(head)
            message = {"role": "assistant", "content": "nothing to do"}
            payload = json.dumps(
                {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            ).encode()
            client.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload
            )
        done.set()

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    try:
        run = run_harness(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", tmp_path)
    finally:
        done.wait(5)
        listener.close()
        thread.join(5)
    assert run.returncode == 0, run.log
    assert re.search(rb"(?im)^authorization: Bearer test-key\r?$", captured[0])
    assert (run.workdir / "answer.txt").read_text() == "nothing to do"
