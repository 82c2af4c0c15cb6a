"""The one check of a sandbox's resource limits, as both sides make it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.domain import EpisodeSpec, InvalidArgument
from orchestrator.domain import Resources as EpisodeResources
from protos.shared.resources import resource_problem
from sandbox_agent import InvalidSpec
from sandbox_agent.spec import Resources as SandboxResources
from sandbox_agent.spec import SandboxSpec


@dataclass
class Cores:
    cpus: float


def test_limits_within_their_bounds_pass() -> None:
    assert resource_problem(SandboxResources()) is None
    assert resource_problem(EpisodeResources()) is None
    assert resource_problem(SandboxResources(cpus=256, memory_mb=16, pids=8, disk_mb=16, inodes=1024)) is None


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        (SandboxResources(cpus=0), ("cpus", "0 must be > 0 and <= 256")),
        (SandboxResources(cpus=256.5), ("cpus", "256.5 must be > 0 and <= 256")),
        (SandboxResources(memory_mb=15), ("memory_mb", "15 must be between 16 and 1048576")),
        (SandboxResources(pids=7), ("pids", "7 must be between 8 and 4194304")),
        (SandboxResources(disk_mb=1 << 25), ("disk_mb", f"{1 << 25} must be between 16 and 16777216")),
        (SandboxResources(inodes=10), ("inodes", "10 must be between 1024 and 268435456")),
        (Cores(cpus=-1), ("cpus", "-1 must be > 0 and <= 256")),  # a record without the others
    ],
)
def test_the_first_limit_out_of_bounds_is_named(resources: object, problem: tuple[str, str]) -> None:
    assert resource_problem(resources) == problem


def test_each_side_names_the_field_in_its_own_error() -> None:
    with pytest.raises(InvalidArgument) as refused:
        EpisodeSpec(image="base", resources=EpisodeResources(memory_mb=1)).validate()
    assert str(refused.value) == "spec.resources.memory_mb: 1 must be between 16 and 1048576"
    with pytest.raises(InvalidSpec) as invalid:
        SandboxSpec(image="base", resources=SandboxResources(pids=1)).validated()
    assert str(invalid.value) == "resources.pids: 1 must be between 8 and 4194304"
