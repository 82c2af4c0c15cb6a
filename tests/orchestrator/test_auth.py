"""Who may call the orchestrator: TLS with bearer tokens and roles on the public API, mutual TLS
with node certificates on the registry; every RPC of both services is tried."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from orchestrator import StasisClient
from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings, add_token
from orchestrator.api.access import METHOD_ROLES
from orchestrator.cli.local import LocalStack
from orchestrator.cli.pki import ClusterPki
from orchestrator.client import merge_context
from orchestrator.domain import InvalidArgument, PermissionDenied, Role
from protos.shared.tls import ORCHESTRATOR, TlsFiles
from protos.stasis.v1 import agent_pb2 as apb
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from tests.orchestrator.conftest import STASIS as STASIS_CLI
from tests.orchestrator.conftest import cli, wait_until
from tests.rpcs import methods, status_of

STASIS = pb.DESCRIPTOR.services_by_name["Stasis"]
REGISTRY = pb.DESCRIPTOR.services_by_name["NodeRegistry"]
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@dataclass
class Secured:
    orchestrator: Orchestrator
    pki: ClusterPki
    tokens: dict[Role, str]
    tokens_file: Path

    def channel(self) -> grpc.Channel:
        """TLS to the public port, verifying the orchestrator's certificate; no credential."""
        credentials = grpc.ssl_channel_credentials(root_certificates=self.pki.ca_cert.read_bytes())
        return grpc.secure_channel(self.orchestrator.address, credentials)

    def registry(self, tls: TlsFiles) -> grpc.Channel:
        return tls.channel(self.orchestrator.cluster_address, ORCHESTRATOR)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    pki = ClusterPki(tmp_path / "pki")
    tokens_file = tmp_path / "tokens.yaml"
    tokens = {role: add_token(tokens_file, f"{role}-1", role) for role in Role}
    orchestrator = Orchestrator(
        OrchestratorSettings(
            state_dir=tmp_path / "state",
            listen="127.0.0.1:0",
            auth=AuthSettings(pki.orchestrator(), tokens_file, cluster_listen="127.0.0.1:0"),
        )
    ).start()
    try:
        yield Secured(orchestrator, pki, tokens, tokens_file)
    finally:
        orchestrator.stop()


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.mark.timeout(10)
def test_every_public_method_has_a_role() -> None:
    assert set(METHOD_ROLES) == {m.name for m in methods(STASIS)}


@pytest.mark.timeout(120)
def test_every_public_rpc_refuses_strangers_and_lesser_roles(secured: Secured) -> None:
    with secured.channel() as channel:
        for method in methods(STASIS):
            needed = METHOD_ROLES[method.name]
            code, details = status_of(channel, method)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method.name, code, details)
            assert "bearer token" in details
            code, _ = status_of(channel, method, _bearer("stasis_forged"))
            assert code == grpc.StatusCode.UNAUTHENTICATED, method.name
            for role in Role:
                code, details = status_of(channel, method, _bearer(secured.tokens[role]))
                if role < needed:
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (method.name, role, code)
                    assert f"{method.name} needs the {needed} role" in details
                else:  # admitted: the empty request fails on its own merits, if at all
                    assert code not in REFUSALS, (method.name, role, code, details)


@pytest.mark.timeout(60)
def test_plaintext_and_foreign_certificates_never_reach_the_api(secured: Secured, tmp_path: Path) -> None:
    with grpc.insecure_channel(secured.orchestrator.address) as plain:
        code, _ = status_of(
            plain, STASIS.methods_by_name["ListNodes"], _bearer(secured.tokens[Role.OPERATOR])
        )
    assert code == grpc.StatusCode.UNAVAILABLE
    # A server certificate from another CA is refused by the client, so a token is never sent to it.
    other = ClusterPki(tmp_path / "other")
    other.orchestrator()
    credentials = grpc.ssl_channel_credentials(root_certificates=other.ca_cert.read_bytes())
    with grpc.secure_channel(secured.orchestrator.address, credentials) as channel:
        code, _ = status_of(
            channel, STASIS.methods_by_name["ListNodes"], _bearer(secured.tokens[Role.OPERATOR])
        )
    assert code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.timeout(60)
def test_the_node_registry_takes_only_each_nodes_own_certificate(secured: Secured, tmp_path: Path) -> None:
    with secured.channel() as public:  # not on the public port at all
        for method in methods(REGISTRY):
            code, _ = status_of(public, method, _bearer(secured.tokens[Role.OPERATOR]))
            assert code == grpc.StatusCode.UNIMPLEMENTED, method.name
    ca = secured.pki.ca_cert.read_bytes()
    with grpc.secure_channel(
        secured.orchestrator.cluster_address,
        grpc.ssl_channel_credentials(root_certificates=ca),
        [("grpc.ssl_target_name_override", ORCHESTRATOR)],
    ) as no_cert:
        for method in methods(REGISTRY):
            assert status_of(no_cert, method)[0] == grpc.StatusCode.UNAVAILABLE, method.name
    other = ClusterPki(tmp_path / "other").node("node-2")
    foreign = TlsFiles(secured.pki.ca_cert, other.cert, other.key)
    with secured.registry(foreign) as channel:
        assert status_of(channel, REGISTRY.methods_by_name["Heartbeat"])[0] == grpc.StatusCode.UNAVAILABLE

    # A node with a good certificate can speak for no other node: RegisterNode cannot be hijacked.
    info = apb.NodeInfo(name="node-2", slots=1, memory_mb=1024)
    hijack = pb.RegisterNodeRequest(info=info, address="127.0.0.1:1")
    for holder in (secured.pki.node("node-1"), secured.pki.orchestrator()):
        with secured.registry(holder) as channel:
            stub = pb_grpc.NodeRegistryStub(channel)
            for method, request in (
                (stub.RegisterNode, hijack),
                (stub.Heartbeat, pb.HeartbeatRequest(node="node-2")),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    method(request, timeout=10)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "not node 'node-2'" in err.value.details()
    assert secured.orchestrator.store.nodes.all() == []
    with secured.registry(secured.pki.node("node-2")) as channel:
        reply = pb_grpc.NodeRegistryStub(channel).RegisterNode(hijack, timeout=10)
    assert reply.heartbeat_interval_s > 0
    assert [n.name for n in secured.orchestrator.store.nodes.all()] == ["node-2"]


@pytest.mark.timeout(60)
def test_the_client_config_carries_the_credential(secured: Secured, tmp_path: Path) -> None:
    config = tmp_path / "client" / "config"
    cluster = {"server": secured.orchestrator.address, "certificate-authority": str(secured.pki.ca_cert)}
    merge_context(config, "viewer", cluster=cluster, user={"token": secured.tokens[Role.VIEWER]})
    token_file = tmp_path / "client" / "ops.token"
    token_file.write_text(secured.tokens[Role.OPERATOR] + "\n")
    merge_context(config, "ops", cluster=cluster, user={"token-file": str(token_file)})
    with StasisClient(config=config) as ops:  # ops is current: the last context merged
        assert ops.nodes() == []
    with StasisClient(config=config, context="viewer") as viewer:
        assert viewer.nodes() == []
        with pytest.raises(PermissionDenied, match="viewer-1 is a viewer; DrainNode needs the operator role"):
            viewer.drain("node-1")
    with pytest.raises(InvalidArgument, match="has no entry named 'nobody'"):
        StasisClient(config=config, context="nobody")
    # A token is never sent in the clear: a context with one needs a certificate authority.
    merge_context(config, "plain", cluster={"server": secured.orchestrator.address}, user={"token": "x"})
    with pytest.raises(InvalidArgument, match="certificate-authority"):
        StasisClient(config=config)


@pytest.mark.timeout(60)
def test_tokens_are_issued_and_revoked_without_a_restart(secured: Secured) -> None:
    with secured.channel() as channel:
        list_nodes = STASIS.methods_by_name["ListNodes"]
        late = add_token(secured.tokens_file, "late", Role.VIEWER)
        assert status_of(channel, list_nodes, _bearer(late))[0] == grpc.StatusCode.OK
        add_token(secured.tokens_file, "late", Role.VIEWER, replace=True)
        assert status_of(channel, list_nodes, _bearer(late))[0] == grpc.StatusCode.UNAUTHENTICATED
        # An edit that breaks the file admits no one: keeping the tokens last read would keep
        # one the edit meant to revoke. Mending the file admits its tokens again.
        ops = _bearer(secured.tokens[Role.OPERATOR])
        good = secured.tokens_file.read_text()
        secured.tokens_file.write_text(good + "  - {name: typo, role: wizard\n")
        assert status_of(channel, list_nodes, ops)[0] == grpc.StatusCode.UNAUTHENTICATED
        secured.tokens_file.write_text(good)
        assert status_of(channel, list_nodes, ops)[0] == grpc.StatusCode.OK


@pytest.mark.timeout(240)
def test_events_record_who_asked_and_only_operators_see_hidden_files(
    make_stack: Callable[..., LocalStack], tmp_path: Path
) -> None:
    stack = make_stack(nodes=1, slots=1)
    tokens = stack.state_dir / "tokens.yaml"
    config = tmp_path / "trainer-config"
    cluster = {"server": stack.address, "certificate-authority": str(stack.pki.ca_cert)}
    merge_context(config, "t", cluster=cluster, user={"token": add_token(tokens, "alice", Role.TRAINER)})
    merge_context(config, "v", cluster=cluster, user={"token": add_token(tokens, "vic", Role.VIEWER)})
    spec = {
        "image": "base",
        "command": ["sleep", "600"],
        "reward": {"command": ["cat", "/tests/answer"], "files": {"/tests/answer": "42\n"}},
    }
    with StasisClient(config=config, context="t") as alice, stack.client() as ops:
        episode = alice.submit(spec)
        wait_until(lambda: ops.get(episode.id).state == "RUNNING", 120, "the episode to run")
        ops.preempt(episode.id, "audit")
        wait_until(lambda: ops.get(episode.id).state == "PREEMPTED", 120, "the preemption")
        alice.cancel(episode.id)
        assert alice.get(episode.id).spec.reward.files == {}
        with StasisClient(config=config, context="v") as vic:
            assert vic.get(episode.id).spec.reward.files == {}
            with pytest.raises(PermissionDenied):
                vic.cancel(episode.id)
        assert ops.get(episode.id).spec.reward.files == {"/tests/answer": b"42\n"}
        asked = {(e.to_state or e.message, e.actor) for e in ops.events(episode.id) if e.actor}
        ops.drain("node-1")
        node_events = [e for e in ops.events() if e.kind == "node" and e.reason == "drain requested"]
    assert ("PENDING", "alice (trainer)") in asked
    assert ("CHECKPOINTING", "local-operator (operator)") in asked
    assert ("CANCELLED", "alice (trainer)") in asked
    assert [e.actor for e in node_events] == ["local-operator (operator)"]
    shown = cli(stack, "events", episode.id, "-o", "json").stdout
    assert "alice (trainer)" in shown


@pytest.mark.timeout(60)
def test_a_context_made_with_the_cli_reaches_the_orchestrator(secured: Secured, tmp_path: Path) -> None:
    """What an operator does with a cluster's CA and token (docs/helm.md): one command, then plain calls."""
    token_file = tmp_path / "ops.token"
    token_file.write_text(secured.tokens[Role.OPERATOR] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "STASIS_ADDR"} | {
        "STASIS_CONFIG": str(tmp_path / "cfg")
    }
    made = subprocess.run(
        [STASIS_CLI, "config", "set-context", "rl", "--server", secured.orchestrator.address,
         "--certificate-authority", str(secured.pki.ca_cert), "--token-file", str(token_file)],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert made.returncode == 0 and "context rl" in made.stderr, made.stderr
    listed = subprocess.run(
        [STASIS_CLI, "nodes", "-o", "json"], capture_output=True, text=True, env=env, timeout=30
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == {"items": []}, listed.stderr
