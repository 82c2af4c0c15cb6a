"""The node registry: agents register, then report their sandboxes and images every heartbeat.
Only the leading orchestrator keeps it; a standby refuses (UNAVAILABLE), so agents that know
several orchestrators move on to the next."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc

from orchestrator import wire
from orchestrator.api.status import required, rpc
from orchestrator.control import Control, SandboxView
from orchestrator.domain import NodeRecord, NodeState, PermissionDenied
from protos.stasis.v1 import agent_pb2 as apb
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from protos.tls import node_of, peer_identity


def _images(images: Iterable[apb.Image]) -> dict[str, list[str]]:
    return {i.digest: sorted(i.names) for i in images}


class RegistryService(pb_grpc.NodeRegistryServicer):
    def __init__(self, control: Control, must_lead: Callable[[], None], *, certified: bool = False) -> None:
        self.control = control
        self._must_lead = must_lead
        """Raises StandingBy unless this orchestrator leads."""
        self.certified = certified
        """Callers hold node certificates (the mutual-TLS cluster port): each speaks only for its own node."""

    def _speaks_for(self, context: grpc.ServicerContext, field: str, node: str) -> str:
        required(field, node)
        if self.certified:
            identity = peer_identity(context)
            if node_of(identity) != node:
                raise PermissionDenied(
                    f"{field}: the caller's certificate is for {identity or 'no one'!r}, "
                    f"not node {node!r}; a node may register and heartbeat only as itself"
                )
        self._must_lead()
        return node

    @rpc
    def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> pb.RegisterNodeResponse:
        self._speaks_for(context, "info.name", request.info.name)
        required("address", request.address)
        node = wire.decode(
            request.info, NodeRecord,
            address=request.address, state=NodeState.READY, images=_images(request.info.images),
            registered_at=time.time(),
        )  # fmt: skip
        self.control.members.registered(node, [SandboxView.from_pb(s) for s in request.sandboxes])
        return pb.RegisterNodeResponse(heartbeat_interval_s=self.control.settings.heartbeat_interval_s)

    @rpc
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        known = self.control.members.heartbeat(
            self._speaks_for(context, "node", request.node),
            [SandboxView.from_pb(s) for s in request.sandboxes],
            _images(request.images),
        )
        return pb.HeartbeatResponse(known=known)

    @rpc
    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveResponse:
        self.control.commands.drain(self._speaks_for(context, "node", request.node), "its agent is stopping")
        return pb.LeaveResponse()
