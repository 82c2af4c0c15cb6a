"""One orchestrator process: state store, ledger, snapshot store, control loop, gRPC servers
(public API, node registry, health, reflection) and, when configured, the gateway.

Orchestrators that share a PostgreSQL database elect one leader (`leadership`). The leader runs
the control loop, the node registry, the gateway and the node watcher. A standby serves the
API's reads, and it refuses writes with UNAVAILABLE, naming the leader. Its gRPC health reports
`stasis.v1.Stasis` and `stasis.v1.NodeRegistry` as NOT_SERVING, so only the leader is ready;
the overall status ("") is SERVING while the process is alive.

With `auth`, the public API takes TLS plus bearer tokens, and the node registry has a port of
its own where only nodes with a certificate from the cluster CA complete the handshake (and
heartbeats have their own threads, never waiting behind long streams). Without it, one
plaintext port serves both.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator.api.access import PublicAccess, Tokens
from orchestrator.api.join import JoinService
from orchestrator.api.leadership import Leadership
from orchestrator.api.registry import RegistryService
from orchestrator.api.service import StasisService
from orchestrator.api.settings import AuthSettings, OrchestratorSettings
from orchestrator.api.streams import API_WORKERS
from orchestrator.control import AgentPool, Control, Verifier
from orchestrator.domain import Episode, FailedPrecondition, InvalidArgument, NotFound
from orchestrator.gateway import ChatRenderer, Gateway, GatewaySettings, Peer, RendererUnavailable, live_peer
from orchestrator.state import (
    PostgresStateStore,
    SqliteStateStore,
    StateDirLock,
    StateStore,
    live_run,
    standing_by,
)
from orchestrator.trajectory import Ledger
from orchestrator.trajectory.forks import ForkOrigin, origin_of
from protos.shared import pki
from protos.shared.address import host_of, join_host_port
from protos.shared.admission import OPEN, Admission
from protos.shared.tls import bind
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from snapshots import SnapshotStore

if TYPE_CHECKING:
    from orchestrator.control.kube import NodeIdentities

log = logging.getLogger(__name__)


class Orchestrator:
    """A running control plane; `port` is the bound gRPC port."""

    def __init__(self, settings: OrchestratorSettings) -> None:
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        # The embedded store has no lease to fence a second orchestrator on the same file.
        self._owner = None if settings.database_url else StateDirLock(settings.state_dir, "an orchestrator")
        try:
            self._assemble(settings)
        except BaseException:
            if self._owner is not None:
                self._owner.release()
            raise

    def _assemble(self, settings: OrchestratorSettings) -> None:
        self.store = _state_store(settings)
        self.ledger = _ledger(settings, self.store)
        self.snapshots = SnapshotStore.open(settings.store_url)
        auth = settings.auth
        self.agents = AgentPool(auth.tls if auth else None)
        self.control = Control(
            settings.control,
            self.store,
            self.snapshots,
            self.agents,
            cursor=lambda e: self.ledger.cursor(e.id),
            finish=Verifier(self.agents, self.ledger),
            gateway_env=self._gateway_env,
            ledger=self.ledger,
        )
        self.gateway: Gateway | None = None
        # The model's template is loaded now, so that a wrong renderer or tokenizer stops the
        # start before any node is set up.
        self.renderer = _renderer(settings.gateway)
        self.watcher: Any = None
        try:
            # Joining nodes have no token and no certificate yet: they bring their own proof.
            admission = (
                [Admission(PublicAccess(Tokens(auth.tokens_file)), (*OPEN, JOIN_METHODS))] if auth else []
            )
        except (OSError, ValueError) as exc:
            raise FailedPrecondition(f"cannot read the tokens file: {exc}") from None
        self.server = _server(API_WORKERS, "api", admission)
        self.probes = _server(2, "health") if settings.health_listen else None
        """Health checking alone, in plaintext, for probes; None without `health_listen`."""
        self.cluster = _server(REGISTRY_WORKERS, "registry") if auth else None
        """The node registry's own mutual-TLS server; None when `server` carries it too."""
        service = StasisService(
            self.control, self.store, self.snapshots, self.ledger, settings.import_registry
        )
        pb_grpc.add_StasisServicer_to_server(service, self.server)
        agents = _agents(auth)
        registry = RegistryService(self.control, self._must_lead, certified=auth is not None, places=agents)
        pb_grpc.add_NodeRegistryServicer_to_server(registry, self.cluster or self.server)
        pb_grpc.add_ClusterJoinServicer_to_server(_joining(auth, agents), self.server)
        self.health = health.HealthServicer()
        services = [
            pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Stasis", "NodeRegistry", "ClusterJoin")
        ]
        status = health_pb2.HealthCheckResponse
        for name in [*services, ""]:  # the leader's services say NOT_SERVING until it leads
            self.health.set(name, status.NOT_SERVING if name in LEADER_SERVICES else status.SERVING)
        if self.probes is not None:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.probes)
            self.health_port = _listen(self.probes, settings.health_listen, None, client_certs=False)
        for server in (self.server, self.cluster):
            if server is not None:
                health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
                reflection.enable_server_reflection(
                    (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
                )
        self.port = _listen(self.server, settings.listen, auth, client_certs=False)
        self.cluster_port = (
            _listen(self.cluster, auth.cluster_listen, auth, client_certs=True)
            if self.cluster is not None and auth
            else self.port
        )
        # Taken out once the schemas exist: from here on, a store shared with other
        # orchestrators writes only while this one leads.
        self.lease = self.store.lease(f"{socket.gethostname()} at {self.address}")
        self.leadership = Leadership(self.lease, self._lead, self._lost)
        self.lost = threading.Event()
        """Set once this orchestrator's lease lapsed: it leads no more, and should exit."""
        self._with_gateway = True

    @property
    def address(self) -> str:
        return join_host_port(host_of(self.settings.listen, "listen"), self.port)

    @property
    def cluster_address(self) -> str:
        """Where the nodes register and heartbeat."""
        auth = self.settings.auth
        if auth is None:
            return self.address
        return join_host_port(host_of(auth.cluster_listen, "cluster listen"), self.cluster_port)

    def _gateway_env(self, e: Episode) -> dict[str, str]:
        g = self.settings.gateway
        if not g.upstream:
            return {}
        # Every client library finds the gateway, with the episode's key, under its own names.
        return {
            "OPENAI_BASE_URL": g.base_url,
            "OPENAI_API_KEY": e.token,
            "ANTHROPIC_BASE_URL": g.anthropic_url,
            "ANTHROPIC_API_KEY": e.token,
            "ANTHROPIC_AUTH_TOKEN": e.token,
        }

    def resumed_at(self, e: Episode) -> float:
        """When the snapshot the current run was restored from froze the sandbox; 0 for a run
        started afresh. Turns delivered before then are part of the restored harness's past."""
        if not e.restored_from:
            return 0.0
        record = self.store.snapshots.get(e.restored_from)  # a fork child's: its parent's
        return record.created_at if record is not None else 0.0

    def live_from(self, e: Episode, peer: Peer) -> bool:
        """Whether a gateway connection from `peer` can be the episode's current run."""
        try:
            node_address = self.store.nodes.get(e.node).address if e.node else ""
        except NotFound:
            node_address = ""
        return live_peer(e, peer, node_address)

    def start(self, *, gateway: bool = True) -> Orchestrator:
        """Lead at once if the lease is free, else stand by until the leader's lapses; and serve."""
        self._with_gateway = gateway
        self.leadership.start()
        for server in (self.server, self.cluster, self.probes):
            if server is not None:
                server.start()
        if self.settings.auth is None:
            log.warning("orchestrator listening on %s WITHOUT authentication (--insecure)", self.address)
        else:
            log.info("orchestrator listening on %s, nodes on %s", self.address, self.cluster_address)
        log.info("state in %s", self.settings.state_dir)
        return self

    @property
    def leading(self) -> bool:
        return self.leadership.leading.is_set()

    def _lead(self) -> None:
        """Start what only the leader runs; every part picks up where the last leader left off."""
        self.control.start()
        if self._with_gateway and self.settings.gateway.listen:
            self.start_gateway()
        if self.settings.control.kube_watch:
            from orchestrator.control.kube import NodeWatcher

            self.watcher = NodeWatcher(self.control.commands, self.store).start()
        for name in LEADER_SERVICES:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def _lost(self) -> None:
        """The lease lapsed: stop what the leader runs (the fence already refuses its writes)."""
        self._stop_serving()
        self.control.stop()
        self.lost.set()

    def _stop_serving(self) -> None:
        for name in (*LEADER_SERVICES, "stasis.v1.ClusterJoin", ""):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.watcher is not None:
            self.watcher.stop()
        if self.gateway is not None:
            self.gateway.stop()

    def _max_staleness(self, e: Episode) -> int | None:
        """The bound of the episode's GRPO group; None for none, or no group."""
        return self.store.groups.get(e.group_id).max_staleness if e.group_id else None

    def _must_lead(self) -> None:
        """Refuse what only the leader may do (the node registry's calls) on a standby."""
        if not self.leading:
            raise standing_by(self.lease)

    def start_gateway(self) -> Gateway:
        """Serve the model endpoint; its address must exist (the nodes add 169.254.1.1)."""
        g = self.settings.gateway
        if not g.upstream:
            raise FailedPrecondition("the gateway needs an upstream model server (--upstream)")
        self.gateway = Gateway(
            g, self.ledger, self.store.episodes.by_token, self.resumed_at, self.live_from, renderer=self.renderer,
            live_run=live_run, max_staleness=self._max_staleness, family=self.store.episodes.keyed_by,
        ).start()  # fmt: skip
        log.info(
            "gateway listening on %s%s, forwarding to %s",
            g.listen,
            " (TLS, for nodes)" if g.tls else "",
            g.upstream,
        )
        return self.gateway

    def stop(self) -> None:
        self._stop_serving()
        for server in (self.server, self.cluster, self.probes):
            if server is not None:
                server.stop(grace=2).wait()
        self.control.stop()
        self.leadership.stop()  # after the control loop: a standby may take over at once
        self.ledger.close()
        self.snapshots.close()
        self.store.close()
        if self._owner is not None:
            self._owner.release()


def _renderer(g: GatewaySettings) -> ChatRenderer | None:
    if not g.renderer:
        return None
    try:
        return ChatRenderer(g.renderer, Path(g.tokenizer), dict(g.renderer_options))
    except RendererUnavailable as exc:
        raise InvalidArgument("renderer", str(exc)) from None


def _state_store(settings: OrchestratorSettings) -> StateStore:
    """The PostgreSQL store when given a database URL, else the embedded one in the state dir."""
    if not settings.database_url:
        return SqliteStateStore(settings.state_dir / "state.db")
    store = PostgresStateStore(settings.database_url)
    log.info("episodes, events and nodes in %s", store.where)
    return store


def _ledger(settings: OrchestratorSettings, store: StateStore) -> Ledger:
    """The ledger beside the state: in the PostgreSQL store's database, so every orchestrator on
    it finds every turn, else in the state dir's SQLite file."""

    def origin(episode_id: str) -> ForkOrigin | None:
        try:
            episode = store.episodes.get(episode_id)
        except NotFound:
            return None
        return origin_of(episode, store.snapshots.get)

    if isinstance(store, PostgresStateStore):
        return Ledger.postgres(store.database, origins=origin)
    return Ledger.sqlite(settings.state_dir / "state.db", origins=origin)


LEADER_SERVICES = ("stasis.v1.Stasis", "stasis.v1.NodeRegistry")
"""What gRPC health reports SERVING only on the leader, so that readiness probes pick it."""

REGISTRY_WORKERS = 16
"""Threads of the node registry's own server: every call is a short heartbeat or registration."""


def _server(workers: int, name: str, interceptors: list[grpc.ServerInterceptor] | None = None) -> grpc.Server:
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name),
        interceptors=interceptors or [],
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ],
    )


def _listen(server: grpc.Server, address: str, auth: AuthSettings | None, *, client_certs: bool) -> int:
    try:
        return bind(server, address, auth.tls if auth else None, require_client_cert=client_certs)
    except ValueError as exc:
        raise FailedPrecondition(str(exc)) from None


JOIN_METHODS = "/stasis.v1.ClusterJoin/"


def _agents(auth: AuthSettings | None) -> NodeIdentities | None:
    """The agents in Kubernetes, when `--join-service-account` names their service account:
    which node a joining one runs on, and where each node is for the registry."""
    if auth is None or not auth.join_service_account:
        return None
    from orchestrator.control.kube import NodeIdentities

    try:
        return NodeIdentities(auth.join_service_account)
    except ValueError as exc:
        raise FailedPrecondition(f"--join-service-account: {exc}") from None


def _joining(auth: AuthSettings | None, agents: NodeIdentities | None) -> JoinService:
    """The join service: signing for nodes that prove themselves, when given the CA's key."""
    if auth is None or auth.ca_key is None:
        return JoinService(None, None)
    if agents is None:
        raise FailedPrecondition("--tls-ca-key needs --join-service-account: who may join, if not anyone")
    try:
        ca = pki.load_ca(auth.tls.ca.read_bytes(), auth.ca_key.read_bytes())
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"cannot use the cluster CA ({auth.tls.ca}, {auth.ca_key}): {exc}") from None
    return JoinService(ca, agents, lifetime=datetime.timedelta(seconds=auth.node_certificate_s))
