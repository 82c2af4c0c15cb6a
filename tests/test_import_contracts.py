"""Every import contract in pyproject.toml holds on the tree, and fails when broken: for each one,
an import that breaks it is planted in a copy of the tree, and `lint-imports` there must fail
naming that contract. A contract the linter accepts but does not enforce fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: list[dict[str, Any]] = CONFIG["contracts"]
LINT = Path(sys.executable).with_name("lint-imports")
OUTSIDER = "orchestrator.domain"
"""A module no contract lets import a protected module."""


def _first(layer: str) -> str:
    return layer.split("|")[0].strip()


def _private_module(tree: Path) -> str:
    """Some private module of the root packages, by dotted name."""
    for root in CONFIG["root_packages"]:
        for path in sorted((tree / root).rglob("_*.py")):
            if not path.name.startswith("__"):
                return ".".join(path.relative_to(tree).with_suffix("").parts)
    raise AssertionError("no private module to plant an import of")


def _breach(contract: dict[str, Any], tree: Path) -> tuple[str, str]:
    """(importer, imported): an import that breaks `contract`."""
    kind = contract["type"]
    if kind == "independence":
        return contract["modules"][0], contract["modules"][1]
    if kind == "forbidden":
        return contract["source_modules"][0], contract["forbidden_modules"][0]
    if kind == "layers":
        return _first(contract["layers"][-1]), _first(contract["layers"][0])
    if kind == "protected":
        assert OUTSIDER not in contract["allowed_importers"]
        return OUTSIDER, contract["protected_modules"][0]
    if kind == "private_modules":
        private = _private_module(tree)
        root, parent = private.split(".")[0], private.rpartition(".")[0]
        if parent == root:
            root = next(r for r in CONFIG["root_packages"] if r != parent)
        return root, private  # an ancestor, not the parent, or another package
    raise AssertionError(f"no breach is known for a {kind!r} contract; teach this test one")


def _plant(tree: Path, importer: str, imported: str) -> None:
    module = tree.joinpath(*importer.split("."))
    path = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
    assert path.is_file(), f"{importer} is not in the tree"
    with path.open("a") as f:
        f.write(f"\nimport {imported}  # planted\n")


def _copy(dest: Path) -> Path:
    for root in CONFIG["root_packages"]:
        shutil.copytree(
            REPO / root,
            dest / root,
            ignore=lambda d, names: [
                n for n in names if not n.endswith(".py") and not (Path(d) / n).is_dir()
            ],
        )
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree), COLUMNS="1000")
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(120)
def test_every_contract_fails_when_an_import_breaks_it(tmp_path: Path) -> None:
    clean = _copy(tmp_path / "clean")
    trees: list[tuple[str, Path]] = []
    for i, contract in enumerate(CONTRACTS):
        tree = _copy(tmp_path / f"breach-{i}")
        _plant(tree, *_breach(contract, tree))
        trees.append((contract["name"], tree))

    with ThreadPoolExecutor(max_workers=8) as pool:
        clean_run = pool.submit(_lint, clean)
        runs = [(name, pool.submit(_lint, tree)) for name, tree in trees]
        results = [(name, run.result()) for name, run in runs]

    # The copies differ from the clean one by the planted import alone: what it breaks, it broke.
    kept = clean_run.result()
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in kept.stdout
    for name, run in results:
        assert run.returncode != 0, f"{name}: a planted import left it kept\n{run.stdout}"
        assert f"{name} BROKEN" in run.stdout, f"{name}: not reported broken\n{run.stdout}"
