"""The public surface of the snapshots package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import snapshots

PACKAGE = Path(snapshots.__file__).parent


@pytest.mark.timeout(10)
def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(snapshots) if not name.startswith("_")}
    assert set(snapshots.__all__) == public
    for name in snapshots.__all__:
        assert getattr(snapshots, name) is not None


@pytest.mark.timeout(10)
def test_every_error_is_a_snapshot_error() -> None:
    errors = [
        obj
        for name in snapshots.__all__
        if isinstance(obj := getattr(snapshots, name), type) and issubclass(obj, BaseException)
    ]
    assert len(errors) == 12
    for error in errors:
        assert issubclass(error, snapshots.SnapshotError), error
    assert issubclass(snapshots.StoreUnavailable, snapshots.StoreError)
    assert issubclass(snapshots.StoreRejected, snapshots.StoreError)


@pytest.mark.timeout(10)
def test_no_stasis_imports_and_boto_only_in_the_s3_module() -> None:
    for module in PACKAGE.glob("*.py"):
        tree = ast.parse(module.read_text())
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        assert not imported & {"orchestrator", "sandbox_agent", "protos"}, module
        if module.name != "_s3.py":
            assert not imported & {"boto3", "botocore"}, module
