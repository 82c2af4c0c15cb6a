"""A real local Stasis for the orchestrator tests: orchestrator, agent processes, real sandboxes."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from orchestrator import StasisClient
from orchestrator.api import add_token
from orchestrator.cli.local import AgentProcess, LocalSettings, LocalStack, agent_command, free_port
from orchestrator.cli.pki import ClusterPki
from orchestrator.client import merge_context
from orchestrator.domain import Role
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from protos.shared.address import split_host_port
from protos.shared.tls import node_identity
from sandbox_agent import AgentSettings, Node
from sandbox_agent.images.cache import ImageCache
from sandbox_agent.settings import DEFAULT_BASE_IMAGE_TAR
from snapshots import SnapshotStore
from tests.dockerd import docker
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener
from tests.orchestrator.loops import Loop
from tests.orchestrator.worlds import World, count_generations, make_world
from tests.postgres import PostgresServer

REPO = Path(__file__).resolve().parents[2]
STASIS = str(Path(sys.executable).with_name("stasis"))


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    """A control loop in-process with two fake nodes, node-1 and node-2 (`loops.Loop`)."""
    loop = Loop(tmp_path)
    loop.register("node-1", "node-2")
    yield loop
    loop.close()


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    """A ledger's opener, once in SQLite and once in PostgreSQL (`ledgers.py`)."""
    with opener(request, tmp_path / "ledger.db") as open_:
        yield open_


@pytest.fixture
def world(tmp_path: Path, open_ledger: OpenLedger) -> Iterator[World]:
    """A gateway before the reference model, its generations counted (`worlds.World`)."""
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    w = make_world(tmp_path, model.url, model, open_ledger(), metrics_listen="127.0.0.1:0")
    assert (
        w.gateway.logprobs_mode("reference") == "processed"
    )  # checked once, before the generations are counted
    count_generations(w)
    yield w
    w.gateway.stop()
    model.stop()


def remove_node_sandboxes(root: Path) -> None:
    """Delete every sandbox a node root (<state dir>/nodes/<node>) holds, as the node's own agent
    would: one of the stack named after that state dir."""
    if (root / "sandboxes").is_dir():
        stack = LocalSettings(state_dir=root.parent.parent).stack
        node = Node(AgentSettings(node=root.name, root=root, stack=stack, base_image_tar=None))
        node.delete_all()
        node.close()


def remove_sandboxes(state_dir: Path) -> None:
    """Delete every sandbox the nodes of a stopped stack left running (agents leave them on purpose)."""
    for root in sorted((state_dir / "nodes").glob("*")):
        remove_node_sandboxes(root)


@pytest.fixture(scope="session")
def base_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image cache holding the base image, imported once per session for `seed_images`."""
    root = tmp_path_factory.mktemp("base-images") / "images"
    ImageCache(root).import_tarball(DEFAULT_BASE_IMAGE_TAR, name="base")
    return root


def seed_images(settings: LocalSettings, images: Path) -> None:
    """Give each image cache of a stack, as hard links, a cache's images made once (the session's
    base image, or a module's): its agents find the base image and skip their own import. That
    import makes 8,700 files, and on this host's ext4, just after other trees were deleted, it
    takes 2 to 10 s (inode allocation skips the recently deleted inodes) in every stack."""
    for cache in {settings.image_cache(f"node-{i}") for i in range(1, settings.nodes + 1)}:
        cache.parent.mkdir(parents=True, exist_ok=True)
        link_tree(images, cache)


def link_base_tree(base_images: Path, dest: Path) -> None:
    """Make `dest` the base image's tree, its files hard links to the session's, to build an image
    on: add files to it, never write one that is there (pip's --target leaves what exists)."""
    link_tree(ImageCache(base_images).resolve("base").rootfs, dest)


def link_tree(source: Path, dest: Path) -> None:
    """Make `dest` a copy of the tree `source` whose files are hard links to its files."""
    subprocess.run(["cp", "-a", "--link", str(source), str(dest)], check=True)


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def docker_base(dockerd: str) -> Iterator[str]:
    """The base image in the test's Docker engine, for Dockerfiles to start FROM."""
    docker(dockerd, "import", str(DEFAULT_BASE_IMAGE_TAR), "stasis-test/base:1", check=True, timeout=300)
    yield "stasis-test/base:1"
    docker(dockerd, "rmi", "-f", "stasis-test/base:1")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (`tests/postgres.py`); stopped, and its data removed,
    however the session ends. `postgres.database()` makes a fresh database."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_stack(tmp_path: Path, base_images: Path) -> Iterator[Callable[..., LocalStack]]:
    """Start a local stack in this process, its image caches seeded with `images` (the base
    image's cache unless given); all its sandboxes are removed afterwards."""
    stacks: list[LocalStack] = []

    def start(images: Path = base_images, **overrides: object) -> LocalStack:
        settings = LocalSettings(
            state_dir=tmp_path / f"stack{len(stacks)}",
            listen=f"127.0.0.1:{free_port()}",
            **{"stacks_dir": tmp_path / "stacks", **overrides},  # type: ignore[arg-type]
        )
        seed_images(settings, images)
        stack = LocalStack(settings)
        stacks.append(stack)
        stack.start()
        return stack

    yield start
    for stack in stacks:
        stack.stop()
        remove_sandboxes(stack.state_dir)


class Cluster:
    """Orchestrators and agents as separate processes, so any can be SIGKILLed and restarted.
    Set up as an operator would: a cluster CA, certificates on the command lines, a tokens file.

    With a `database_url`, its `replicas` orchestrators share that PostgreSQL database: the first
    leads, and the agents know them all. A list gives each replica its own URL of the database
    (another address of the server, for a link that one of them loses). Replica i listens on `addresses[i]`; `address` is the
    first's."""

    def __init__(
        self,
        state_dir: Path,
        base_images: Path,
        nodes: int = 2,
        slots: int = 2,
        lost_after: float = 30,
        database_url: str | list[str] = "",
        replicas: int = 1,
    ) -> None:
        self.state_dir = state_dir
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(replicas)]
        self.address = self.addresses[0]
        self.cluster_addresses = [f"127.0.0.1:{free_port()}" for _ in range(replicas)]
        self.health_addresses = [f"127.0.0.1:{free_port()}" for _ in range(replicas)]
        """Plaintext gRPC health checking alone, as the kubelet probes it."""
        self.lost_after = lost_after
        self.database_urls = database_url if isinstance(database_url, list) else [database_url] * replicas
        self.orchestrators: list[subprocess.Popen[bytes] | None] = [None] * replicas
        self.logs = [state_dir / "logs" / f"orchestrator-{i}.log" for i in range(replicas)]
        self.log = self.logs[0]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.pki = ClusterPki(state_dir / "pki")
        self.tls = self.pki.orchestrator()
        self.tokens = state_dir / "tokens.yaml"
        self.client_config = state_dir / "config"
        token = add_token(self.tokens, "ops", Role.OPERATOR)
        merge_context(
            self.client_config, "cluster",
            cluster={"server": self.address, "certificate-authority": str(self.pki.ca_cert)}, user={"token": token},
        )  # fmt: skip
        for replica in range(replicas):
            self.start_orchestrator(replica)
        local = LocalSettings(state_dir=state_dir, nodes=nodes, slots=slots, listen=self.address)
        seed_images(local, base_images)
        self.agents = {}
        for i in range(1, nodes + 1):
            name = f"node-{i}"
            argv = agent_command(local, name, ",".join(self.cluster_addresses), tls=self.pki.node(name))
            self.agents[name] = AgentProcess(name, argv, state_dir / "logs" / f"{name}.log")
            self.agents[name].start()
        with self.client() as c:
            wait_until(
                lambda: len([n for n in c.nodes() if n.state == "READY"]) == nodes, 60, "nodes to register"
            )

    def client(self, replica: int = 0, retry_for_s: float = 60) -> StasisClient:
        return StasisClient(self.addresses[replica], config=self.client_config, retry_for_s=retry_for_s)

    def server_command(self, replica: int = 0) -> list[str]:
        tls = self.tls
        return [
            sys.executable, "-m", "orchestrator.cli", "server",
            "--listen", self.addresses[replica],
            "--state-dir", str(self.state_dir if replica == 0 else self.state_dir / f"orchestrator-{replica}"),
            "--snapshot-store", f"file://{self.state_dir / 'snapshots'}",
            "--node-lost-after", str(self.lost_after),
            "--tls-ca", str(tls.ca), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
            "--tokens-file", str(self.tokens),
            "--cluster-listen", self.cluster_addresses[replica],
            "--health-listen", self.health_addresses[replica],
        ]  # fmt: skip

    def start_orchestrator(self, replica: int = 0) -> None:
        url = self.database_urls[replica]
        env = dict(os.environ, STASIS_DATABASE_URL=url) if url else None
        with open(self.logs[replica], "ab") as out:
            process = subprocess.Popen(
                self.server_command(replica), stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self.orchestrators[replica] = process
        _, port = split_host_port(self.addresses[replica])
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"orchestrator did not start:\n{self.logs[replica].read_text()[-3000:]}")
            time.sleep(0.1)

    def kill_orchestrator(self, replica: int = 0) -> None:
        process = self.orchestrators[replica]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        for process in self.orchestrators:
            if process and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        remove_sandboxes(self.state_dir)


def assert_history_is_whole(c: StasisClient, episode_id: str, cluster: Cluster) -> None:
    """Every transition follows the last, and every stored snapshot is recorded once, in order."""
    transitions = [e for e in c.events(episode_id) if e.kind == "transition"]
    for before, after in itertools.pairwise(transitions):
        assert after.from_state == before.to_state, f"gap between {before} and {after}"
    records = c.snapshots(episode_id)
    recorded = [s.id for s in records]
    with SnapshotStore.open(f"file://{cluster.state_dir / 'snapshots'}") as store:
        stored = [s.snapshot_id for s in store.history(episode_id)]
    # Retention may have collected older snapshots (keep the last 3); what remains is recorded,
    # is the newest, and is exactly what the history marks as available.
    assert stored == recorded[len(recorded) - len(stored) :], "every stored snapshot is recorded, in order"
    assert len(stored) >= min(3, len(recorded))
    assert [s.id for s in records if s.available] == stored
    assert len(recorded) == len(set(recorded))


@pytest.fixture
def make_cluster(tmp_path: Path, base_images: Path) -> Iterator[Callable[..., Cluster]]:
    clusters: list[Cluster] = []

    def start(**kw: object) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(clusters)}", base_images, **kw)  # type: ignore[arg-type]
        clusters.append(cluster)
        return cluster

    yield start
    for c in clusters:
        c.stop()


def cli(
    target: str | LocalStack | Cluster,
    *args: str,
    check: bool = True,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the installed `stasis` program, as a user in a second shell would: at an address, or
    at a stack or cluster with its operator's client config."""
    environ = dict(os.environ)
    if isinstance(target, str):
        environ["STASIS_ADDR"] = target
    else:
        environ |= {"STASIS_ADDR": target.address, "STASIS_CONFIG": str(target.client_config)}
    environ |= env or {}
    result = subprocess.run([STASIS, *args], capture_output=True, text=True, env=environ, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"stasis {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def _agent_channel(stack: LocalStack, node: str, address: str) -> grpc.Channel:
    """A channel to a node's agent as the orchestrator dials it (with its certificate, if any)."""
    if not stack.settings.secure:
        return grpc.insecure_channel(address)
    return stack.pki.orchestrator().channel(address, node_identity(node))


def import_image(stack: LocalStack, node: str, directory: Path, name: str) -> None:
    """Import an image directory on one node through its agent, and wait until the node reports it."""
    from protos.stasis.v1 import agent_pb2, agent_pb2_grpc

    address = next(n.address for n in stack.client().nodes() if n.name == node)
    with _agent_channel(stack, node, address) as channel:
        agent_pb2_grpc.SandboxAgentStub(channel).ImportImage(
            agent_pb2.ImportImageRequest(name=name, directory=str(directory)), timeout=600
        )
    wait_until(
        lambda: any(
            name in image.names for n in stack.client().nodes() if n.name == node for image in n.images
        ),
        30,
        f"image {name} known on {node}",
    )
