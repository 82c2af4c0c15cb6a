"""Wires the control plane together: state store, snapshot store, control loop and gRPC server."""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator.control import Control
from orchestrator.errors import FailedPrecondition
from orchestrator.service import RegistryService, StasisService
from orchestrator.settings import OrchestratorSettings
from orchestrator.store import SqliteStateStore
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from snapshots import SnapshotStore

log = logging.getLogger(__name__)


class Orchestrator:
    """A running control plane; `port` is the bound gRPC port."""

    def __init__(self, settings: OrchestratorSettings) -> None:
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = SqliteStateStore(settings.state_dir / "state.db")
        self.snapshots = SnapshotStore.open(settings.store_url)
        self.control = Control(settings, self.store, self.snapshots)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="api"),
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        pb_grpc.add_StasisServicer_to_server(
            StasisService(self.control, self.store, self.snapshots), self.server
        )
        pb_grpc.add_NodeRegistryServicer_to_server(RegistryService(self.control), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        services = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Stasis", "NodeRegistry")]
        for name in [*services, ""]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = self.server.add_insecure_port(settings.listen)
        if self.port == 0:
            raise FailedPrecondition(f"cannot listen on {settings.listen}")

    @property
    def address(self) -> str:
        host = self.settings.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self) -> Orchestrator:
        self.server.start()
        self.control.start()
        log.info("orchestrator listening on %s, state in %s", self.address, self.settings.state_dir)
        return self

    def stop(self) -> None:
        for name in ("stasis.v1.Stasis", "stasis.v1.NodeRegistry", ""):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(grace=2).wait()
        self.control.stop()
        self.snapshots.close()
        self.store.close()
