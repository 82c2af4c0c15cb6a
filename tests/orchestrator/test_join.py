"""Nodes join a cluster by proving which node they are: the orchestrator asks Kubernetes whose
service-account token a node brings and which node that token's pod runs on, then signs the
node's certificate for that node alone.

Kubernetes here is `tests.kubeapi.StandInApiServer`, a stand-in API server over real HTTP (no
API server can run on these machines); the orchestrator reaches it with the real `kubernetes`
client through a kubeconfig, as it would reach a cluster's from outside one. The same stand-in
says where each node's agent pod is, which a registering node's address must match.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings, add_token
from orchestrator.api.join import JOIN_BURST, JOIN_RATE, Throttle
from orchestrator.cli.local import AgentProcess, LocalSettings, agent_command, free_port
from orchestrator.cli.pki import ClusterPki
from orchestrator.control.kube import KUBE_TIMEOUT_S
from orchestrator.domain import NodeState, Role
from protos.shared import pki
from protos.shared.tls import ORCHESTRATOR, anonymous_channel, node_identity
from protos.stasis.v1 import agent_pb2 as apb
from protos.stasis.v1 import agent_pb2_grpc as apb_grpc
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from sandbox_agent import FailedPrecondition
from sandbox_agent.server.joining import joined
from sandbox_agent.settings import JoinSettings
from tests.kubeapi import Pod, StandInApiServer
from tests.orchestrator.conftest import seed_images, wait_until

AGENTS = "stasis:stasis-agent"


@dataclass
class Cluster:
    orchestrator: Orchestrator
    pki: ClusterPki
    kube: StandInApiServer
    pods: dict[str, Pod]
    root: Path

    def token_file(self, token: str, name: str) -> Path:
        path = self.root / f"{name}.token"
        path.write_text(token + "\n")
        return path

    def join(self, node: str, token: str) -> JoinSettings:
        return JoinSettings(self.orchestrator.address, self.token_file(token, node), self.pki.ca_cert)

    def ask(self, node: str, token: str, csr: bytes | None = None) -> tuple[grpc.StatusCode, str]:
        request = pb.JoinClusterRequest(
            node=node, token=token, csr_pem=csr if csr is not None else pki.request(pki.new_key(), node)
        )
        with anonymous_channel(self.orchestrator.address, self.pki.ca_cert, ORCHESTRATOR) as channel:
            try:
                pb_grpc.ClusterJoinStub(channel).JoinCluster(request, timeout=30)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """An orchestrator that lets nodes join; parametrised indirectly, the seconds its node
    certificates last."""
    lifetime = getattr(request, "param", AuthSettings.node_certificate_s)
    kube = StandInApiServer()
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig")))
    pods = {node: kube.add_pod("stasis", f"stasis-agent-{node}", node) for node in ("node-a", "node-b")}
    certs = ClusterPki(tmp_path / "pki")
    tokens_file = tmp_path / "tokens.yaml"
    add_token(tokens_file, "ops", Role.OPERATOR)
    auth = AuthSettings(
        certs.orchestrator(), tokens_file, cluster_listen="127.0.0.1:0",
        ca_key=certs.ca_key, join_service_account=AGENTS, node_certificate_s=lifetime,
    )  # fmt: skip
    orchestrator = Orchestrator(
        OrchestratorSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0", auth=auth)
    ).start()
    try:
        yield Cluster(orchestrator, certs, kube, pods, tmp_path)
    finally:
        orchestrator.stop()
        kube.stop()


@pytest.mark.timeout(60)
def test_a_node_that_proves_itself_gets_a_certificate_for_itself_alone(cluster: Cluster) -> None:
    token = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    files = joined("node-a", cluster.root / "agent-a", cluster.join("node-a", token))
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(cluster.pki.ca_cert.read_bytes()))
    assert cert.subject.rfc4514_string() == f"CN={node_identity('node-a')}"
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life <= datetime.timedelta(days=1, minutes=5), f"nothing revokes it: it lasts a day, not {life}"
    assert files.key.stat().st_mode & 0o077 == 0, "the node's key is its own"
    assert cluster.kube.reviews[-1]["spec"]["audiences"] == ["stasis"], "a token for this use alone"

    # The certificate is the node's name: it registers as node-a and as nothing else.
    info = apb.NodeInfo(name="node-a", slots=1, memory_mb=1024)
    with files.channel(cluster.orchestrator.cluster_address, ORCHESTRATOR) as channel:
        registry = pb_grpc.NodeRegistryStub(channel)
        registry.RegisterNode(pb.RegisterNodeRequest(info=info, address="127.0.0.1:1"), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            registry.Leave(pb.LeaveRequest(node="node-b"), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        registry.Leave(pb.LeaveRequest(node="node-a"), timeout=10)
    assert cluster.orchestrator.store.nodes.get("node-a").state == NodeState.DRAINING

    reviews = len(cluster.kube.reviews)
    assert joined("node-a", cluster.root / "agent-a", cluster.join("node-a", token)) == files
    assert len(cluster.kube.reviews) == reviews, "a current certificate is kept, not asked for again"


@pytest.mark.timeout(60)
def test_no_other_proof_gets_a_certificate(cluster: Cluster) -> None:
    a = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    intruder = cluster.kube.issue_token("stasis:default", cluster.pods["node-a"])
    refusals = [
        (cluster.ask("node-b", a), grpc.StatusCode.PERMISSION_DENIED, "runs on node 'node-a', not 'node-b'"),
        (cluster.ask("node-a", "forged"), grpc.StatusCode.UNAUTHENTICATED, "does not vouch for it"),
        (
            cluster.ask("node-a", intruder),
            grpc.StatusCode.PERMISSION_DENIED,
            "not to the agents' service account",
        ),
        (cluster.ask("node-a", a, b"not a request"), grpc.StatusCode.INVALID_ARGUMENT, "csr_pem:"),
        (cluster.ask("node-a", ""), grpc.StatusCode.INVALID_ARGUMENT, "token: is required"),
    ]
    for (code, details), want, words in refusals:
        assert code == want and words in details, (code, details)
    # The agent's side says why, rather than serve without a certificate.
    with pytest.raises(FailedPrecondition, match="did not let node node-b join: PERMISSION_DENIED"):
        joined("node-b", cluster.root / "agent-b", cluster.join("node-b", a))
    assert not (cluster.root / "agent-b" / "tls" / "node.crt").exists()

    del cluster.kube.pods[("stasis", cluster.pods["node-a"].name)]
    code, details = cluster.ask("node-a", a)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "no longer exists" in details
    # A token Kubernetes vouches for without naming the audience asked for could be one minted
    # for any use: an authenticator that ignores audiences proves nothing.
    cluster.kube.audience_aware = False
    code, details = cluster.ask("node-a", cluster.kube.issue_token(AGENTS, cluster.pods["node-a"]))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "did not confirm it is for the audience" in details
    cluster.kube.audience_aware = True
    # A stuck API server holds a join no longer than KUBE_TIMEOUT_S; the agent asks again.
    cluster.kube.review_delay_s = KUBE_TIMEOUT_S + 5
    asked = time.monotonic()
    code, details = cluster.ask("node-b", cluster.kube.issue_token(AGENTS, cluster.pods["node-b"]))
    assert code == grpc.StatusCode.UNAVAILABLE and "Kubernetes API did not answer" in details
    assert time.monotonic() - asked < KUBE_TIMEOUT_S + 2
    cluster.kube.stop()
    code, details = cluster.ask("node-b", cluster.kube.issue_token(AGENTS, cluster.pods["node-b"]))
    assert code == grpc.StatusCode.UNAVAILABLE and "Kubernetes API did not answer" in details


@pytest.mark.timeout(60)
def test_an_orchestrator_without_the_ca_key_signs_nothing(tmp_path: Path) -> None:
    certs = ClusterPki(tmp_path / "pki")
    tokens_file = tmp_path / "tokens.yaml"
    add_token(tokens_file, "ops", Role.OPERATOR)
    auth = AuthSettings(certs.orchestrator(), tokens_file, cluster_listen="127.0.0.1:0")
    orchestrator = Orchestrator(
        OrchestratorSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0", auth=auth)
    ).start()
    try:
        request = pb.JoinClusterRequest(
            node="node-a", token="t", csr_pem=pki.request(pki.new_key(), "node-a")
        )
        with (
            anonymous_channel(orchestrator.address, certs.ca_cert, ORCHESTRATOR) as channel,
            pytest.raises(grpc.RpcError) as err,
        ):
            pb_grpc.ClusterJoinStub(channel).JoinCluster(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "issues no node certificates" in (err.value.details() or "")
    finally:
        orchestrator.stop()


@pytest.mark.timeout(90)
def test_the_cluster_configuration_serves_and_signs_from_the_ca_alone(tmp_path: Path) -> None:
    """As the Helm chart runs it: the orchestrator gets the CA (certificate and key) and a tokens
    file, issues its own certificate for the names it is reached by, and signs joining nodes'."""
    kube = StandInApiServer()
    try:
        certs = ClusterPki(tmp_path / "ca")
        certs.orchestrator()  # makes the CA; the server issues its own certificate from it
        tokens_file = tmp_path / "tokens.yaml"
        add_token(tokens_file, "ops", Role.OPERATOR)
        port, cluster_port = free_port(), free_port()
        argv = [
            sys.executable, "-m", "orchestrator.cli", "server",
            "--listen", f"127.0.0.1:{port}", "--cluster-listen", f"127.0.0.1:{cluster_port}",
            "--state-dir", str(tmp_path / "state"),
            "--tls-ca", str(certs.ca_cert), "--tls-ca-key", str(certs.ca_key),
            "--tls-hosts", "stasis.stasis.svc,localhost,127.0.0.1",
            "--tokens-file", str(tokens_file), "--join-service-account", AGENTS,
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig"))}
        with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as server:
            try:
                wait_until(lambda: _listening(port) or server.poll() is not None, 30, "the orchestrator")
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                issued = x509.load_pem_x509_certificate(
                    (tmp_path / "state/pki/orchestrator.crt").read_bytes()
                )
                names = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                assert {"stasis.stasis.svc", "localhost", ORCHESTRATOR} <= set(
                    names.get_values_for_type(x509.DNSName)
                )
                pod = kube.add_pod("stasis", "stasis-agent-x", "node-x")
                token_file = tmp_path / "agent.token"
                token_file.write_text(kube.issue_token(AGENTS, pod))
                files = joined(
                    "node-x", tmp_path / "agent", JoinSettings(f"127.0.0.1:{port}", token_file, certs.ca_cert)
                )
                info = apb.NodeInfo(name="node-x", slots=1, memory_mb=1024)
                with files.channel(f"127.0.0.1:{cluster_port}", ORCHESTRATOR) as channel:
                    pb_grpc.NodeRegistryStub(channel).RegisterNode(
                        pb.RegisterNodeRequest(info=info, address="127.0.0.1:1"), timeout=10
                    )
            finally:
                server.terminate()
                server.wait(timeout=30)
    finally:
        kube.stop()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(60)
def test_a_flood_of_join_requests_reaches_kubernetes_at_a_bounded_rate(cluster: Cluster) -> None:
    """Anyone may ask to join, and each request costs a TokenReview: one peer's flood is cut to
    its burst, then to JOIN_RATE a second, and the rest refused as worth retrying."""
    reviews = len(cluster.kube.reviews)
    answers = [cluster.ask("node-a", "forged") for _ in range(JOIN_BURST + 5)]
    codes = [code for code, _ in answers]
    assert codes.count(grpc.StatusCode.UNAUTHENTICATED) == JOIN_BURST, codes
    throttled = [details for code, details in answers if code == grpc.StatusCode.UNAVAILABLE]
    assert len(throttled) == 5 and all("too many join requests" in d for d in throttled), throttled
    assert len(cluster.kube.reviews) - reviews == JOIN_BURST, "the refused ones cost Kubernetes nothing"
    time.sleep(1.2 / JOIN_RATE)
    token = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    assert cluster.ask("node-a", token)[0] == grpc.StatusCode.OK, "and the peer may ask again soon"


def test_the_join_throttle_refills_per_peer_and_bounds_all_peers() -> None:
    now = [0.0]
    throttle = Throttle(rate=2, burst=3, peers=2, clock=lambda: now[0])
    assert [throttle.admit("a") for _ in range(4)] == [0, 0, 0, 0.5], "a burst, then 1/rate apart"
    now[0] += 0.5
    assert throttle.admit("a") == 0 and throttle.admit("a") == 0.5
    # All peers together may make ten times as many: a burst of 30, of which 29 are left.
    assert all(throttle.admit(f"peer-{i}") == 0 for i in range(29))
    assert throttle.admit("d") == pytest.approx(1 / 20), "the total's budget is spent"
    assert len(throttle._by_peer) == 2, "only the peers heard from last are remembered"


@pytest.mark.parametrize("cluster", [3.0], indirect=True)
@pytest.mark.timeout(60)
def test_an_expired_certificate_is_refused_by_the_node_registry(cluster: Cluster) -> None:
    """TLS checks a certificate's dates at the handshake alone: a connection made while it was
    valid would speak for the node for as long as it stays open, so the registry checks each call."""
    token = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    files = joined("node-a", cluster.root / "agent-a", cluster.join("node-a", token))
    expires = x509.load_pem_x509_certificate(files.cert.read_bytes()).not_valid_after_utc
    assert expires - datetime.datetime.now(datetime.UTC) < datetime.timedelta(seconds=4), "it lasts 3 s"
    info = apb.NodeInfo(name="node-a", slots=1, memory_mb=1024)
    with files.channel(cluster.orchestrator.cluster_address, ORCHESTRATOR) as channel:
        registry = pb_grpc.NodeRegistryStub(channel)
        registry.RegisterNode(pb.RegisterNodeRequest(info=info, address="127.0.0.1:1"), timeout=10)
        assert registry.Heartbeat(pb.HeartbeatRequest(node="node-a"), timeout=10).known
        time.sleep(max(0.0, (expires - datetime.datetime.now(datetime.UTC)).total_seconds()) + 0.5)
        with pytest.raises(grpc.RpcError) as err:
            registry.Heartbeat(pb.HeartbeatRequest(node="node-a"), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
        assert "the certificate of node 'node-a' expired at" in (err.value.details() or "")
    # A new connection with it does not get past the handshake.
    with files.channel(cluster.orchestrator.cluster_address, ORCHESTRATOR) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.NodeRegistryStub(channel).Heartbeat(pb.HeartbeatRequest(node="node-a"), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.timeout(60)
def test_a_node_registers_only_at_an_address_kubernetes_has_for_it(cluster: Cluster) -> None:
    """The orchestrator sends a node its sandboxes, and the verifier its hidden tests, at the
    address it registered: a copied node key must not be able to name another."""
    token = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    files = joined("node-a", cluster.root / "agent-a", cluster.join("node-a", token))
    cluster.pods["node-a"].ip = "127.0.0.2"
    # Another pod on the node, not an agent: its address is not the node's agent's.
    cluster.kube.pods[("stasis", "intruder")] = Pod(
        "stasis", "intruder", "node-a", ip="127.0.0.4", service_account="default"
    )
    cluster.kube.put("nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.3"}]},
    })  # fmt: skip
    info = apb.NodeInfo(name="node-a", slots=1, memory_mb=1024)
    with files.channel(cluster.orchestrator.cluster_address, ORCHESTRATOR) as channel:
        registry = pb_grpc.NodeRegistryStub(channel)
        for declared in ("127.0.0.1:7072", "127.0.0.4:7072", "[::1]:7072"):
            with pytest.raises(grpc.RpcError) as err:
                registry.RegisterNode(pb.RegisterNodeRequest(info=info, address=declared), timeout=10)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
            assert f"node 'node-a' declared {declared!r}, but Kubernetes has it at 127.0.0.2, 127.0.0.3" in (
                err.value.details() or ""
            )
        assert not cluster.orchestrator.store.nodes.all(), "none registered"
        # Its agent pod's address, or its node's.
        for declared in ("127.0.0.2:7072", "127.0.0.3:7072"):
            registry.RegisterNode(pb.RegisterNodeRequest(info=info, address=declared), timeout=10)
            assert cluster.orchestrator.store.nodes.get("node-a").address == declared


@pytest.mark.parametrize("cluster", [6.0], indirect=True)
@pytest.mark.timeout(120)
def test_a_joined_agent_renews_its_certificate_through_join_before_it_expires(
    cluster: Cluster, base_images: Path
) -> None:
    """A real agent, started as the chart starts it (--join, no certificate given), with
    certificates that last 6 s: it joins again for each next one two thirds of the way through,
    and its registration and its own server carry on with the new one, without a restart."""
    local = LocalSettings(state_dir=cluster.root / "stack", nodes=1)
    seed_images(local, base_images)
    token = cluster.kube.issue_token(AGENTS, cluster.pods["node-a"])
    # The stack's agent, but for its certificate: none given, it joins for one.
    argv = [
        a for a in agent_command(local, "node-a", cluster.orchestrator.cluster_address) if a != "--insecure"
    ]
    argv += ["--heartbeat", "0.5", "--tls-ca", str(cluster.pki.ca_cert), "--join", cluster.orchestrator.address,
             "--join-token-file", str(cluster.token_file(token, "node-a"))]  # fmt: skip
    agent = AgentProcess("node-a", argv, cluster.root / "agent-a.log")
    agent.start()
    try:
        cert_file = local.state_dir.resolve() / "nodes" / "node-a" / "tls" / "node.crt"
        wait_until(lambda: cluster.orchestrator.store.nodes.all(), 60, "the agent to register")
        first = x509.load_pem_x509_certificate(cert_file.read_bytes())
        assert first.not_valid_after_utc - first.not_valid_before_utc < datetime.timedelta(seconds=10)
        held = [first]
        reviews = len(cluster.kube.reviews)

        def renewed_twice() -> bool:
            cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
            if cert.serial_number != held[-1].serial_number:
                assert datetime.datetime.now(datetime.UTC) < held[-1].not_valid_after_utc, (
                    "renewed before expiry"
                )
                held.append(cert)
            return len(held) >= 3

        wait_until(renewed_twice, 30, "two renewals")
        assert len(cluster.kube.reviews) - reviews >= 2, "each renewal is a join, with its token reviewed"
        assert all(c.not_valid_after_utc < held[-1].not_valid_after_utc for c in held[:-1])
        # The first certificate has expired: the node heartbeats still, with the new one.
        assert datetime.datetime.now(datetime.UTC) > first.not_valid_after_utc
        beat = time.time()
        members = cluster.orchestrator.control.members
        wait_until(lambda: members.last_heartbeat("node-a") > beat, 10, "a heartbeat")
        assert cluster.orchestrator.store.nodes.get("node-a").state == NodeState.READY
        # Its server presents the new one to a new connection (an expired one fails the handshake).
        address = cluster.orchestrator.store.nodes.get("node-a").address
        with cluster.pki.orchestrator().channel(address, node_identity("node-a")) as channel:
            info = apb_grpc.SandboxAgentStub(channel).GetNodeInfo(apb.GetNodeInfoRequest(), timeout=10)
        assert info.name == "node-a"
    finally:
        agent.stop()


def test_the_local_stacks_node_certificates_last_a_week_and_are_issued_again_when_due(tmp_path: Path) -> None:
    """`stasis up` gives its nodes certificates itself, from its own CA: a week's, and the next
    one once two thirds have passed (the running stack asks every hour)."""
    certs = ClusterPki(tmp_path / "pki")
    files = certs.node("node-1")
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=7, minutes=5)
    assert certs.node("node-1") == files and files.cert.read_bytes() == pki.pem(cert), "kept while current"
    ca = pki.load_ca(certs.ca_cert.read_bytes(), certs.ca_key.read_bytes())
    short = pki.issue(ca, cert.public_key(), node_identity("node-1"), lifetime=datetime.timedelta(seconds=3))
    files.cert.write_bytes(pki.pem(short))
    time.sleep((pki.due(short) - datetime.datetime.now(datetime.UTC)).total_seconds() + 0.1)
    certs.node("node-1")
    renewed = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert (
        renewed.serial_number != short.serial_number
        and renewed.not_valid_after_utc > short.not_valid_after_utc
    )
    assert pki.pair(files.cert.read_bytes(), files.key.read_bytes())
