"""`kubectl stasis` with no address finds the release's orchestrator Service in the current
Kubernetes context and namespace, reaches it through a port-forward, and takes the operator's
credential from the release's Secrets.

The Kubernetes API is the stand-in of `tests/kubeapi.py` (no API server can run here), spoken to
by the real `kubernetes` client; its port-forward carries the stream to a real orchestrator with
TLS and tokens. The program is the installed `kubectl-stasis`, run as kubectl runs a plugin.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings, add_token
from orchestrator.cli.pki import ClusterPki
from orchestrator.domain import Role
from tests.kubeapi import StandInApiServer

PLUGIN = str(Path(sys.executable).with_name("kubectl-stasis"))
RELEASE = {"app.kubernetes.io/part-of": "stasis", "app.kubernetes.io/instance": "rl"}
SELECTOR = {"app.kubernetes.io/name": "stasis", "app.kubernetes.io/instance": "rl"}


@dataclass
class Release:
    """What `helm install rl` makes in namespace `training`, as the stand-in serves it."""

    api: StandInApiServer
    orchestrator: Orchestrator
    kubeconfig: Path
    home: Path

    def plugin(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "STASIS_CONFIG": str(self.home / "no-stasis-config"),
            "HOME": str(self.home),
        }
        env.pop("STASIS_ADDR", None)
        return subprocess.run([PLUGIN, *args], capture_output=True, text=True, env=env, timeout=60)


def _meta(name: str, component: str, **labels: str) -> dict[str, object]:
    return {
        "name": name,
        "namespace": "training",
        "labels": {**RELEASE, **SELECTOR, "app.kubernetes.io/component": component, **labels},
    }


def _pod(name: str, ready: bool) -> dict[str, object]:
    return {
        "metadata": _meta(name, "orchestrator"),
        "spec": {
            "containers": [
                {"name": "orchestrator", "ports": [{"name": "grpc", "containerPort": 7070}]},
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _secret(name: str, **data: bytes) -> dict[str, object]:
    encoded = {k.replace("_", "."): base64.b64encode(v).decode() for k, v in data.items()}
    return {"metadata": _meta(name, "orchestrator"), "type": "Opaque", "data": encoded}


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Release]:
    pki = ClusterPki(tmp_path / "pki")
    tokens = tmp_path / "tokens.yaml"
    operator = add_token(tokens, "operator", Role.OPERATOR)
    orchestrator = Orchestrator(
        OrchestratorSettings(
            state_dir=tmp_path / "state",
            listen="127.0.0.1:0",
            auth=AuthSettings(pki.orchestrator(), tokens, cluster_listen="127.0.0.1:0"),
        )
    ).start()
    api = StandInApiServer()
    try:
        service = {
            "metadata": _meta("rl-stasis", "orchestrator"),
            "spec": {
                "selector": {**SELECTOR, "app.kubernetes.io/component": "orchestrator"},
                "ports": [
                    {"name": "grpc", "port": 7070, "targetPort": "grpc"},
                    {"name": "gateway", "port": 8080, "targetPort": "gateway"},
                ],
            },
        }
        api.add("services", service)
        api.add("pods", _pod("rl-stasis-old", ready=False))
        api.add("pods", _pod("rl-stasis-7d9f", ready=True))
        api.forwards[("training", "rl-stasis-7d9f", 7070)] = orchestrator.port
        api.add("secrets", _secret("rl-stasis-ca", ca_crt=pki.ca_cert.read_bytes(), ca_key=b"not read"))
        api.add("secrets", _secret("rl-stasis-operator-token", token=operator.encode()))
        home = tmp_path / "home"
        home.mkdir()
        yield Release(api, orchestrator, api.kubeconfig(tmp_path / "kubeconfig", namespace="training"), home)
    finally:
        api.stop()
        orchestrator.stop()


@pytest.mark.timeout(120)
def test_kubectl_stasis_finds_the_release_in_the_current_namespace_through_a_port_forward(
    release: Release,
) -> None:
    listed = release.plugin("get", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"items": []}
    assert release.api.port_forwards >= 1, "it reached the orchestrator through the API server's port-forward"

    # An operator-only call gets past authorisation: the credential is the release's operator token.
    drained = release.plugin("drain", "no-such-node")
    assert drained.returncode == 1
    assert "no-such-node" in drained.stderr and "permission" not in drained.stderr.lower(), drained.stderr


@pytest.mark.timeout(120)
def test_namespace_flag_is_respected_and_a_namespace_without_stasis_says_so(release: Release) -> None:
    elsewhere = release.plugin("-n", "default", "get")
    assert elsewhere.returncode == 1
    assert (
        "no Stasis orchestrator Service in namespace default of Kubernetes context stand-in"
        in elsewhere.stderr
    ), elsewhere.stderr
    assert release.plugin("-n", "training", "get", "-o", "json").returncode == 0
    assert release.plugin("get", "-o", "json", "-n", "training").returncode == 0, "as kubectl users write it"


@pytest.mark.timeout(120)
def test_an_explicit_address_is_never_overridden_by_kubernetes(release: Release) -> None:
    direct = release.plugin("--addr", "127.0.0.1:1", "--retry-for", "0", "get")
    assert direct.returncode == 1 and "cannot reach Stasis at 127.0.0.1:1" in direct.stderr, direct.stderr
    assert release.api.port_forwards == 0
