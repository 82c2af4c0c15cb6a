"""scripts/k8s-tools.sh is idempotent and fast once the tools are in place."""

from __future__ import annotations

import subprocess
import tempfile
import time

import pytest

from tests.helm.chart import TEST_TIMEOUT_S, TOOL_TIMEOUT_S, TOOLS_SCRIPT, K8sTools


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_second_run_only_checks(k8s_tools: K8sTools) -> None:
    started = time.monotonic()
    proc = subprocess.run([str(TOOLS_SCRIPT)], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stderr and "extracting" not in proc.stderr, proc.stderr
    assert elapsed < 10, f"a run with everything in place took {elapsed:.1f} s"
    assert "ready: kubectl v1.33." in proc.stderr, proc.stderr


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_tools_are_real_binaries(k8s_tools: K8sTools) -> None:
    helm = subprocess.run(
        [str(k8s_tools.helm), "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        env=k8s_tools.env(),
        timeout=TOOL_TIMEOUT_S,
    )
    assert helm.returncode == 0 and helm.stdout.startswith("v"), helm.stderr
    kubectl = subprocess.run(
        [str(k8s_tools.kubectl), "version", "--client"],
        capture_output=True,
        text=True,
        env=k8s_tools.env(),
        timeout=TOOL_TIMEOUT_S,
    )
    assert kubectl.returncode == 0 and "Client Version: v1.33." in kubectl.stdout, kubectl.stderr


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_without_a_venv_it_says_what_to_run() -> None:
    with tempfile.TemporaryDirectory(prefix="stasis-no-venv-") as empty:
        proc = subprocess.run(
            [str(TOOLS_SCRIPT)],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "STASIS_VENV": empty},
            timeout=TOOL_TIMEOUT_S,
        )
    assert proc.returncode == 1
    assert "run scripts/host-setup.sh first" in proc.stderr
