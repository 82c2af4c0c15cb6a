"""docs/helm.md documents every value of the chart."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helm.chart import CHART, REPO

DOC = REPO / "docs" / "helm.md"


def undocumented(values: dict[str, Any], doc: str, prefix: str = "") -> list[str]:
    """Paths of values.yaml that docs/helm.md does not name; a documented map covers its keys."""
    missing = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if f"`{path}`" in doc:
            continue
        if isinstance(value, dict) and value:
            missing += undocumented(value, doc, f"{path}.")
        else:
            missing.append(path)
    return missing


@pytest.mark.timeout(30)
def test_every_value_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert undocumented(values, DOC.read_text()) == []
