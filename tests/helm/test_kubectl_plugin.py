"""kubectl finds `kubectl-stasis` on PATH and dispatches `kubectl stasis ...` to it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helm.chart import TEST_TIMEOUT_S, TOOL_TIMEOUT_S, K8sTools

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

    Stubbed: the plugin itself. Its real entry point (`orchestrator.cli:main`, installed as
    `kubectl-stasis` by pyproject.toml) is written by another engineer in parallel, and what it
    prints needs a running orchestrator. What this test checks is kubectl's side of the
    contract: a `kubectl-stasis` executable on PATH is listed by `kubectl plugin list`, and
    `kubectl stasis ARGS` runs it with ARGS verbatim and the caller's environment (STASIS_ADDR).
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
