"""The public surfaces of the orchestrator, its rooms and the node agent."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import orchestrator
import sandbox_agent

ROOMS = [
    "api", "cli", "client", "control", "domain", "gateway", "reference_model", "state", "task", "trajectory",
]  # fmt: skip


def _public(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
    }


@pytest.mark.parametrize("module", [orchestrator, sandbox_agent], ids=lambda m: m.__name__)
@pytest.mark.timeout(10)
def test_all_lists_exactly_the_public_names(module: ModuleType) -> None:
    assert set(module.__all__) == _public(module)
    for name in module.__all__:
        assert getattr(module, name) is not None


@pytest.mark.timeout(30)
def test_every_room_says_what_it_owns_and_exports_what_it_lists() -> None:
    found = sorted(m.name for m in pkgutil.iter_modules(orchestrator.__path__) if m.ispkg)
    assert found == ROOMS, "a new room needs an entry here and in the layers contract"
    for name in ROOMS:
        room = importlib.import_module(f"orchestrator.{name}")
        assert room.__doc__ and len(room.__doc__.strip().splitlines()) >= 2, name
        assert set(room.__all__) <= set(vars(room)), name


@pytest.mark.timeout(10)
def test_errors_have_one_root() -> None:
    for module, root in ((orchestrator, orchestrator.StasisError), (sandbox_agent, sandbox_agent.AgentError)):
        errors = [
            obj
            for name in module.__all__
            if isinstance(obj := getattr(module, name), type) and issubclass(obj, BaseException)
        ]
        assert errors and all(issubclass(e, root) for e in errors), module.__name__
