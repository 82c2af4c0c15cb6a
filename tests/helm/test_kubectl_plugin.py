"""kubectl finds `kubectl-stasis` on PATH and dispatches `kubectl stasis ...` to it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helm.chart import TEST_TIMEOUT_S, TOOL_TIMEOUT_S, VENV_BIN, K8sTools

# Stands in for the real `kubectl-stasis` entry point: prints its argv one per line and the
# STASIS_ADDR it was given, so the test sees exactly what kubectl handed over.
STUB = """#!/bin/sh
echo "kubectl-stasis stub"
for arg in "$@"; do echo "arg: $arg"; done
echo "STASIS_ADDR=$STASIS_ADDR"
"""


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="stasis-kubectl-plugin-") as tmp:
        path = Path(tmp) / "kubectl-stasis"
        path.write_text(STUB)
        path.chmod(0o755)
        yield Path(tmp)


def kubectl(tools: K8sTools, plugin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Only the stub's directory and the system directories: the project's .venv/bin holds the
    # real entry point, which would shadow the stub and make `plugin list` warn.
    env = tools.env(path=os.pathsep.join([str(plugin_dir), "/usr/bin", "/bin"]), STASIS_ADDR="127.0.0.1:7070")
    return subprocess.run(
        [str(tools.kubectl), *args], capture_output=True, text=True, env=env, timeout=TOOL_TIMEOUT_S
    )


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_kubectl_lists_and_runs_the_stasis_plugin(k8s_tools: K8sTools, plugin_dir: Path) -> None:
    """Real kubectl 1.33 plugin discovery and dispatch, against a STUBBED `kubectl-stasis`.

    Stubbed: the plugin itself, a shell script that echoes its arguments. The real entry point
    (`orchestrator.cli:main`, installed as `kubectl-stasis` by pyproject.toml) was being written
    by another engineer in parallel, and what it prints needs a running orchestrator; the stub
    pins kubectl's side of the contract on its own: a `kubectl-stasis` executable on PATH is
    listed by `kubectl plugin list`, and `kubectl stasis ARGS` runs it with ARGS verbatim and
    the caller's environment (STASIS_ADDR). The next test runs the real entry point.
    No cluster is contacted: KUBECONFIG points at a file that does not exist.
    """
    listed = kubectl(k8s_tools, plugin_dir, "plugin", "list")
    assert listed.returncode == 0, listed.stderr
    assert str(plugin_dir / "kubectl-stasis") in listed.stdout.splitlines(), listed.stdout

    ran = kubectl(k8s_tools, plugin_dir, "stasis", "get", "-o", "json")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "kubectl-stasis stub",
        "arg: get",
        "arg: -o",
        "arg: json",
        "STASIS_ADDR=127.0.0.1:7070",
    ]

    # Flags after the plugin name are the plugin's, including --addr, even where kubectl has
    # flags of its own with the same spelling.
    ran = kubectl(k8s_tools, plugin_dir, "stasis", "drain", "node-a", "--addr", "10.0.0.1:7070", "--wait")
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stdout.splitlines() if line.startswith("arg: ")] == [
        "arg: drain",
        "arg: node-a",
        "arg: --addr",
        "arg: 10.0.0.1:7070",
        "arg: --wait",
    ]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_kubectl_runs_the_real_entry_point(k8s_tools: K8sTools) -> None:
    """The `kubectl-stasis` that pyproject.toml installs into .venv/bin is a working plugin.

    No orchestrator runs here, so the call that needs one is pointed at a closed loopback
    port and must fail at once with the hint to set --addr or STASIS_ADDR.
    """
    bin_dir = VENV_BIN
    listed = kubectl(k8s_tools, bin_dir, "plugin", "list")
    assert str(bin_dir / "kubectl-stasis") in listed.stdout.splitlines(), listed.stdout + listed.stderr

    helped = kubectl(k8s_tools, bin_dir, "stasis", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("get", "drain", "nodes"):
        assert command in helped.stdout, helped.stdout

    unreachable = kubectl(
        k8s_tools, bin_dir, "stasis", "--addr", "127.0.0.1:1", "--retry-for", "0", "get", "-o", "json"
    )
    assert unreachable.returncode == 1, unreachable.stdout + unreachable.stderr
    assert "cannot reach Stasis at 127.0.0.1:1" in unreachable.stderr
    assert "STASIS_ADDR" in unreachable.stderr
