"""The agent's gRPC service: every RPC, status codes, health and reflection, over a real channel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from orchestrator.cli.pki import ClusterPki
from protos.shared.tls import TlsFiles, node_identity
from protos.stasis.v1 import agent_pb2 as pb
from protos.stasis.v1 import agent_pb2_grpc as pb_grpc
from sandbox_agent import SandboxSpec, SandboxState, serve
from sandbox_agent import checkpoint as ckpt
from sandbox_agent.server.service import node_info_pb
from tests.rpcs import methods, status_of
from tests.sandbox_agent.conftest import NodeFactory


@pytest.fixture
def agents(make_node: NodeFactory) -> Iterator[tuple[pb_grpc.SandboxAgentStub, pb_grpc.SandboxAgentStub]]:
    servers, stubs, channels = [], [], []
    for name in ("node-a", "node-b"):
        server, port = serve(make_node(name), "127.0.0.1:0")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        servers.append(server)
        channels.append(channel)
        stubs.append(pb_grpc.SandboxAgentStub(channel))
    yield stubs[0], stubs[1]
    for channel in channels:
        channel.close()
    for server in servers:
        server.stop(None)


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_lifecycle_over_grpc(
    agents: tuple[pb_grpc.SandboxAgentStub, pb_grpc.SandboxAgentStub], tmp_path: Path
) -> None:
    a, b = agents
    spec = pb.SandboxSpec(image="base", command=["sh", "-c", "echo hi; sleep 600"], address="10.202.0.2")
    created = a.CreateSandbox(pb.CreateSandboxRequest(sandbox_id="s1", spec=spec, files={"/in.txt": b"x"}))
    assert created.state == pb.SANDBOX_STATE_RUNNING and created.node == "node-a"
    assert [s.id for s in a.ListSandboxes(pb.ListSandboxesRequest()).sandboxes] == ["s1"]
    info = a.GetNodeInfo(pb.GetNodeInfoRequest())
    assert info.name == "node-a" and info.running == 1 and info.criu_version.startswith("4.")
    assert any("base" in i.names for i in info.images)

    result = a.Checkpoint(pb.CheckpointRequest(sandbox_id="s1", directory=str(tmp_path / "ck")))
    assert result.timings_ms["dump_ms"] > 0 and result.criu_bytes > 0 and result.layer_bytes > 0
    # How long before the reply it froze: at least the dump, by the node's own clock.
    assert result.timings_ms["dump_ms"] <= result.since_freeze_ms < 60_000
    assert _code(lambda: a.GetSandbox(pb.GetSandboxRequest(sandbox_id="s1"))) == grpc.StatusCode.NOT_FOUND

    restored = b.Restore(pb.RestoreRequest(sandbox_id="s1", directory=str(tmp_path / "ck")))
    assert restored.node == "node-b" and restored.spec.address == "10.202.0.2"
    assert b"hi" in b.GetHarnessLog(pb.GetHarnessLogRequest(sandbox_id="s1")).content
    killed = b.Kill(pb.KillRequest(sandbox_id="s1"))
    assert killed.state == pb.SANDBOX_STATE_EXITED
    b.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id="s1"))
    assert list(b.ListSandboxes(pb.ListSandboxesRequest()).sandboxes) == []


WATCH = """
import os, socket, time
while True:
    fork = open("/.stasis/fork.json").read().strip() if os.path.exists("/.stasis/fork.json") else None
    print("seen", socket.gethostname(), fork, flush=True)
    time.sleep(0.1)
"""


@pytest.mark.timeout(120)
def test_a_restore_as_a_fork_child_over_grpc(
    agents: tuple[pb_grpc.SandboxAgentStub, pb_grpc.SandboxAgentStub], tmp_path: Path
) -> None:
    """A checkpoint directory restored as a fork child: the request's address, host name and
    ForkMark reach the sandbox; the caller's directory is left as it was."""
    a, b = agents
    spec = pb.SandboxSpec(
        image="base", command=["python3", "-c", WATCH], address="10.202.0.5", hostname="parent"
    )
    a.CreateSandbox(pb.CreateSandboxRequest(sandbox_id="ep-p-r1", spec=spec))
    ck = tmp_path / "ck"
    a.Checkpoint(pb.CheckpointRequest(sandbox_id="ep-p-r1", directory=str(ck), leave_running=True))

    def restore(index: int) -> pb.Sandbox:
        mark = pb.ForkMark(
            episode_id="ep-c", parent_episode_id="ep-p", snapshot_id="ep-p-s1", index=index, count=2
        )
        return b.Restore(  # type: ignore[no-any-return]
            pb.RestoreRequest(
                sandbox_id="ep-c-r1", directory=str(ck), address="10.202.0.6", hostname="child", fork=mark
            )
        )

    with pytest.raises(grpc.RpcError) as err:
        restore(2)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "fork.index" in err.value.details()
    assert list(b.ListSandboxes(pb.ListSandboxesRequest()).sandboxes) == []

    restored = restore(1)
    assert (restored.spec.address, restored.spec.hostname) == ("10.202.0.6", "child")
    deadline = time.monotonic() + 30
    log = ""
    while "seen child {" not in log and time.monotonic() < deadline:
        log = b.GetHarnessLog(pb.GetHarnessLogRequest(sandbox_id="ep-c-r1")).content.decode()
        time.sleep(0.1)
    own = log[restored.log_start :].splitlines()
    assert own and all(line.startswith("seen child {") for line in own), own[:3]
    assert '"index": 1, "count": 2}' in own[-1]
    assert ckpt.load(ck, verify=True).spec.hostname == "parent", "the caller's images were not renamed"
    assert a.GetSandbox(pb.GetSandboxRequest(sandbox_id="ep-p-r1")).state == pb.SANDBOX_STATE_RUNNING


@pytest.mark.timeout(120)
def test_node_info_through_the_wire_codec_is_the_message_once_built_by_hand(make_node: NodeFactory) -> None:
    node = make_node("node-info", labels={"zone": "b", "gpu": "none"}, slots=3, memory_mb=2048)
    node.create("s1", SandboxSpec(image="base", command=("sleep", "600")))
    sandboxes = node.list()
    by_hand = pb.NodeInfo(
        name=node.name,
        backend=node.backend.name,
        criu_version=node.ctx.criu_version,
        slots=node.settings.slots,
        memory_mb=node.settings.memory_mb,
        images=[
            pb.Image(digest=i.digest, names=i.names, size_bytes=i.size_bytes) for i in node.images.list()
        ],
        running=sum(1 for st in sandboxes if st.state != SandboxState.EXITED),
        labels=node.settings.labels,
        disk_mb=node.disk.capacity_mb,
        restores_forks=True,
    )
    info = node_info_pb(node)
    assert info.running == 1 and info.slots == 3 and info.labels == {"zone": "b", "gpu": "none"}
    assert info.images and info.disk_mb > 0 and info.criu_version and info.restores_forks
    assert info == by_hand
    assert info.SerializeToString(deterministic=True) == by_hand.SerializeToString(deterministic=True)
    assert info.SerializeToString() == by_hand.SerializeToString()


@pytest.mark.timeout(60)
def test_status_codes(
    agents: tuple[pb_grpc.SandboxAgentStub, pb_grpc.SandboxAgentStub], tmp_path: Path
) -> None:
    a, _ = agents
    bad = pb.SandboxSpec(image="base", command=[])
    assert (
        _code(lambda: a.CreateSandbox(pb.CreateSandboxRequest(sandbox_id="x", spec=bad)))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    unknown = pb.SandboxSpec(image="nope", command=["true"])
    assert (
        _code(lambda: a.CreateSandbox(pb.CreateSandboxRequest(sandbox_id="x", spec=unknown)))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        _code(lambda: a.Restore(pb.RestoreRequest(sandbox_id="x", directory="relative")))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (
        _code(lambda: a.Restore(pb.RestoreRequest(sandbox_id="x", directory=str(tmp_path))))
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert _code(lambda: a.ImportImage(pb.ImportImageRequest(name="x"))) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as pull:
        list(a.PullImage(pb.PullImageRequest(reference="base")))
    assert pull.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reference: 'base' is not a registry reference" in str(pull.value.details())
    with pytest.raises(grpc.RpcError) as err:
        a.Kill(pb.KillRequest(sandbox_id="ghost"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "node node-a: sandbox 'ghost' does not exist" in str(err.value.details())


@pytest.mark.timeout(30)
def test_health_and_reflection(make_node: NodeFactory) -> None:
    server, port = serve(make_node("node-a"), "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(health_pb2.HealthCheckRequest(service="stasis.v1.SandboxAgent"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = {s.name for r in responses for s in r.list_services_response.service}
            assert "stasis.v1.SandboxAgent" in names
    finally:
        server.stop(None)


@pytest.mark.timeout(120)
def test_with_tls_every_rpc_serves_only_the_orchestrator(make_node: NodeFactory, tmp_path: Path) -> None:
    """An agent with its node certificate: no certificate, a foreign CA's, or another party's
    from the cluster CA is refused on every RPC; the orchestrator must find the node it named."""
    pki = ClusterPki(tmp_path / "pki")
    server, port = serve(make_node("node-a"), "127.0.0.1:0", pki.node("node-a"))
    address = f"127.0.0.1:{port}"
    agent = pb.DESCRIPTOR.services_by_name["SandboxAgent"]
    foreign = ClusterPki(tmp_path / "foreign").orchestrator()
    try:
        ca = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())
        for channel in (
            grpc.insecure_channel(address),
            grpc.secure_channel(address, ca, [("grpc.ssl_target_name_override", node_identity("node-a"))]),
            TlsFiles(pki.ca_cert, foreign.cert, foreign.key).channel(address, node_identity("node-a")),
        ):
            with channel:
                for method in methods(agent):
                    assert status_of(channel, method)[0] == grpc.StatusCode.UNAVAILABLE, method.name
        with pki.node("node-b").channel(address, node_identity("node-a")) as neighbour:
            for method in methods(agent):
                code, details = status_of(neighbour, method)
                assert code == grpc.StatusCode.PERMISSION_DENIED, method.name
                assert "serves only stasis-orchestrator" in details
        # The orchestrator dialling node-b at node-a's address finds the wrong node and stops.
        with pki.orchestrator().channel(address, node_identity("node-b")) as misdirected:
            code, _ = status_of(misdirected, agent.methods_by_name["GetNodeInfo"])
            assert code == grpc.StatusCode.UNAVAILABLE
        with pki.orchestrator().channel(address, node_identity("node-a")) as orchestrator:
            info = pb_grpc.SandboxAgentStub(orchestrator).GetNodeInfo(pb.GetNodeInfoRequest(), timeout=10)
            assert info.name == "node-a"
            code, _ = status_of(orchestrator, agent.methods_by_name["ListSandboxes"])
            assert code == grpc.StatusCode.OK
    finally:
        server.stop(None)
