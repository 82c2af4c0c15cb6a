from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_agent import AgentSettings, Node, PhaseHooks
from sandbox_agent.node.backends import make_backend
from sandbox_agent.runtime.backend import Backend
from snapshots import SnapshotStore

NodeFactory = Callable[..., Node]


@pytest.fixture(params=["runc", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("dockerd")
    return str(request.param)


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image cache for every test node: the base image is imported once per session."""
    return tmp_path_factory.mktemp("images")


@pytest.fixture
def make_node(tmp_path: Path, image_cache: Path, request: pytest.FixtureRequest) -> Iterator[NodeFactory]:
    """Nodes with their own roots on this host; every sandbox they hold is deleted at the end."""
    nodes: list[Node] = []

    def factory(
        name: str,
        backend: str = "runc",
        hooks: PhaseHooks | None = None,
        *,
        runtime: Callable[[Backend], Backend] | None = None,
        store: Callable[[SnapshotStore], object] | None = None,
        **overrides: object,
    ) -> Node:
        """`runtime` and `store` wrap the node's real runtime and snapshot store: the seams a
        test injects faults through."""
        docker_url = (
            request.getfixturevalue("dockerd") if backend == "docker" else "unix:///var/run/docker.sock"
        )
        settings = AgentSettings(
            node=name,
            root=tmp_path / name,
            backend=backend,
            docker_url=docker_url,
            **{"image_cache": image_cache, **overrides},  # type: ignore[arg-type]
        )
        if runtime:
            settings.root.mkdir(parents=True, exist_ok=True)  # where the runtime keeps its files
        node = Node(
            settings,
            hooks=hooks,
            backend=runtime(make_backend(settings)) if runtime else None,
            store=store(SnapshotStore.open(settings.snapshot_store)) if store else None,  # type: ignore[arg-type]
        )
        nodes.append(node)
        return node

    yield factory
    for node in nodes:
        if node.settings.root.exists():
            node.delete_all()
        else:
            node.backend.remove_leftovers(set())
        node.close()
    left = [pid for node in nodes for pid in lazy_daemons(node)]
    for pid in left:  # so that no later test meets them
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"CRIU lazy-pages daemons {left} outlived their nodes"


class TcpServer:
    """A TCP echo server on the node's gateway address: the only place sandboxes may reach."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("169.254.1.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self.peers.append(peer[0])
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def accepted(self, count: int, timeout_s: float = 10) -> list[str]:
        """The peers once `count` connections are accepted, or by `timeout_s`: a client's connect
        returns, and it may say so, before this thread has accepted the connection."""
        deadline = time.monotonic() + timeout_s
        while len(self.peers) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.peers)

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            while not self._stop.is_set():
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join()


@pytest.fixture
def tcp_server() -> Iterator[TcpServer]:
    server = TcpServer()
    yield server
    server.close()


def wait_for_log(node: Node, sandbox_id: str, predicate: Callable[[str], object], timeout: float = 30) -> str:
    """Poll the harness log until predicate(log) is truthy; return the log."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = node.harness_log(sandbox_id, 1 << 20).decode()
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(
        f"sandbox {sandbox_id} on {node.name} never logged what was expected; log tail:\n{text[-1500:]}"
    )


def restore_staging(node: Node) -> Path:
    """Where the node stages a lazy restore's files: its dir on the memory tmpfs, if it has one."""
    memory = node.settings.memory_dir
    return memory / f"stasis-{node.host_key}" if memory is not None else node.settings.root / "staging"


def lazy_daemons(node: Node) -> list[int]:
    """The pids of CRIU lazy-pages daemons serving restores staged by this node."""
    dirs = {f"{node.settings.root / 'staging'}/", f"{restore_staging(node)}/"}
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone
            continue
        serving = proc.name.isdigit() and argv[1:3] == ["lazy-pages", "--images-dir"]
        if serving and any(argv[3].startswith(d) for d in dirs):
            pids.append(int(proc.name))
    return pids


def recorded(node: Node, snapshot_id: str) -> str:
    """The digest the orchestrator would have recorded of a snapshot's manifest: as the store holds
    it now (for tests that are not about a manifest replaced since)."""
    assert node.store is not None
    return node.store.manifest(snapshot_id).digest


def staged(node: Node) -> list[Path]:
    """What the node's checkpoints and restores have staged and not yet removed."""
    return [
        p for d in {node.settings.root / "staging", restore_staging(node)} if d.is_dir() for p in d.iterdir()
    ]


def remove_node_dirs(node: Node) -> None:
    """The node's agent stops and its dirs go, as when its machine is lost."""
    node.close()
    shutil.rmtree(node.settings.root)
