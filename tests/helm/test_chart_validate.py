"""`helm lint` passes and every rendered manifest is a valid Kubernetes object (offline schemas)."""

from __future__ import annotations

import importlib
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import CHART, TEST_TIMEOUT_S, Chart, Values, names

# The oldest Kubernetes the chart targets in practice, and the version of the kubectl we ship.
KUBERNETES_VERSIONS = ["1.30.0", "1.33.0"]

# Every optional branch of the templates flipped away from its default.
EVERYTHING_FLIPPED: Values = {
    "upstream.url": "https://models.example.internal/openai",
    "snapshotStore.local.existingClaim": "shared-snapshots",
    "orchestrator.persistence.enabled": False,
    "orchestrator.serviceAccount.create": False,
    "orchestrator.serviceAccount.name": "stasis-operator",
    "orchestrator.rbac.create": False,
    "orchestrator.service.type": "LoadBalancer",
    "orchestrator.service.annotations.example\\.com/internal": "true",
    "orchestrator.extraArgs": ["--log-level=debug"],
    "orchestrator.extraEnv": [{"name": "STASIS_LOG_FORMAT", "value": "json"}],
    "agent.drainOnStop": False,
    "agent.serviceAccount.create": False,
    "agent.extraArgs": ["--label=pool=spot"],
    "agent.priorityClassName": "system-node-critical",
    "image.digest": "sha256:" + "0" * 64,
    "imagePullSecrets": [{"name": "regcred"}],
    "commonAnnotations.owner": "rl-infra",
    "fullnameOverride": "stx",
}

VALUE_SETS = {
    "reference-model": (("reference-model-values.yaml",), None),
    "s3": (("s3-values.yaml",), None),
    "everything-flipped": ((), EVERYTHING_FLIPPED),
}


def kubernetes_validate() -> Any:
    """kubernetes-validate is installed by scripts/k8s-tools.sh, which the k8s_tools fixture runs."""
    return importlib.import_module("kubernetes_validate")


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("values", ["reference-model-values.yaml", "s3-values.yaml"])
def test_helm_lint_passes(chart: Chart, values: str) -> None:
    run = chart.lint(values)
    assert run.returncode == 0, run.explain()
    assert "1 chart(s) linted, 0 chart(s) failed" in run.stdout, run.explain()


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_manifest_validates(chart: Chart, value_set: str, version: str) -> None:
    files, sets = VALUE_SETS[value_set]
    manifests = chart.render(*files, sets=sets)
    kinds = {m["kind"] for m in manifests}
    assert {"ConfigMap", "Service", "Deployment", "DaemonSet"} <= kinds, names(manifests)
    validator = kubernetes_validate()
    failures = []
    for manifest in manifests:
        try:
            validator.validate(manifest, version, strict=True)
        except validator.ValidationError as exc:
            failures.append(
                f"{manifest['kind']}/{manifest['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_validator_is_strict(chart: Chart) -> None:
    """Guard for the test above: a misspelled field must fail, or 'validates' would mean nothing."""
    daemonset = next(m for m in chart.render("reference-model-values.yaml") if m["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostNetwrok"] = True
    validator = kubernetes_validate()
    with pytest.raises(validator.ValidationError, match="hostNetwrok"):
        validator.validate(daemonset, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_chart_packages_with_schema_and_notes(chart: Chart) -> None:
    with tempfile.TemporaryDirectory(prefix="stasis-helm-package-") as out:
        run = chart.helm("package", str(CHART), "--destination", out)
        assert run.returncode == 0, run.explain()
        with tarfile.open(Path(out) / "stasis-0.1.0.tgz") as archive:
            members = set(archive.getnames())
    for path in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/NOTES.txt"):
        assert f"stasis/{path}" in members, sorted(members)
