"""Bad values fail `helm template` and `helm lint` with a message that names the value to fix."""

from __future__ import annotations

import pytest

from tests.helm.chart import TEST_TIMEOUT_S, Chart, Values

REFERENCE = {"referenceModel.enabled": True}

# (values set, text the error must contain). values.schema.json catches most; the templates'
# `fail` checks catch combinations the schema does not express.
REJECTED: dict[str, tuple[Values, str]] = {
    "unknown store type": ({**REFERENCE, "snapshotStore.type": "gcs"}, "/snapshotStore/type"),
    "slots not a number": ({**REFERENCE, "agent.slots": "four"}, "/agent/slots"),
    "zero slots": ({**REFERENCE, "agent.slots": 0}, "/agent/slots"),
    "misspelled key": ({**REFERENCE, "agent.slotz": 4}, "slotz"),
    "upstream not a URL": ({"upstream.url": "vllm:8000"}, "/upstream/url"),
    "bad pull policy": ({**REFERENCE, "image.pullPolicy": "Sometimes"}, "/image/pullPolicy"),
    "port out of range": ({**REFERENCE, "gateway.port": 70000}, "/gateway/port"),
    "no upstream, no reference model": ({}, "/upstream/url"),
    "s3 without bucket": ({**REFERENCE, "snapshotStore.type": "s3"}, "/snapshotStore/s3/bucket"),
    "upstream and reference model": (
        {**REFERENCE, "upstream.url": "http://vllm:8000"},
        "set either upstream.url or referenceModel.enabled=true, not both",
    ),
    "replicas on SQLite": (
        {**REFERENCE, "orchestrator.replicas": 2},
        "orchestrator.replicas > 1 needs database.urlSecret",
    ),
    "no orchestrator": ({**REFERENCE, "orchestrator.replicas": 0}, "/orchestrator/replicas"),
    "health on the gateway port": (
        {**REFERENCE, "orchestrator.healthPort": 8080},
        "orchestrator.healthPort must differ",
    ),
    "gateway on the gRPC port": (
        {**REFERENCE, "gateway.port": 7070},
        "orchestrator.grpcPort and gateway.port must differ",
    ),
}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("case", sorted(REJECTED))
def test_template_rejects(chart: Chart, case: str) -> None:
    sets, message = REJECTED[case]
    run = chart.template(sets=sets)
    assert run.returncode != 0, run.explain()
    assert message in run.stderr, run.explain()


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize(
    "case", ["unknown store type", "no upstream, no reference model", "s3 without bucket"]
)
def test_lint_rejects(chart: Chart, case: str) -> None:
    """Schema violations fail `helm lint`; Helm 4's lint only logs a template's `fail` at INFO level."""
    sets, message = REJECTED[case]
    run = chart.lint(sets=sets)
    assert run.returncode != 0, run.explain()
    assert message in run.stdout + run.stderr, run.explain()


# Values that the schema rejects too, checked again by the templates for installs run with
# --skip-schema-validation: the message names the value and says what it is for.
UNCHECKED: dict[str, tuple[Values, str]] = {
    "no upstream, no reference model": (
        {},
        "upstream.url is required (the OpenAI-compatible model server the gateway forwards to), "
        "unless referenceModel.enabled=true",
    ),
    "s3 without bucket": (
        {**REFERENCE, "snapshotStore.type": "s3"},
        "snapshotStore.s3.bucket is required when snapshotStore.type=s3",
    ),
}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("case", sorted(UNCHECKED))
def test_template_checks_hold_without_the_schema(chart: Chart, case: str) -> None:
    sets, message = UNCHECKED[case]
    run = chart.template(sets=sets, extra=("--skip-schema-validation",))
    assert run.returncode != 0, run.explain()
    assert message in run.stderr, run.explain()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_clusters_without_grpc_probes_are_refused(chart: Chart) -> None:
    """gRPC container probes are GA from Kubernetes 1.27; Chart.yaml's kubeVersion says so."""
    old = chart.template("reference-model-values.yaml", extra=("--kube-version", "1.26.5"))
    assert old.returncode != 0, old.explain()
    assert "kubeVersion" in old.stderr, old.explain()
    supported = chart.template("reference-model-values.yaml", extra=("--kube-version", "1.27.0"))
    assert supported.returncode == 0, supported.explain()
