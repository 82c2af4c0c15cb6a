"""A Harbor task directory, read and checked: instruction.md, task.toml, environment/, tests/
and an optional solution/ (Harbor's task format, schema 1.x; docs/tasks.md).

Every error names the file and the field (`task.toml [agent] timeout_sec`). A field that would
change what a task means and that Stasis does not honour yet is refused, naming it, rather than
ignored. Unknown tables and keys are left alone, as Harbor leaves `[metadata]`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.domain import InvalidArgument, Resources
from orchestrator.domain.spec import MAX_FILES_BYTES, MAX_SECONDS
from protos.shared.address import egress_problem
from protos.shared.resources import resource_problem

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_TIMEOUT_S = 600.0
"""Harbor's default for `[agent] timeout_sec` and `[verifier] timeout_sec`."""


@dataclass(frozen=True)
class Task:
    name: str
    """`[task] name`, else the directory's name."""
    instruction: str
    """instruction.md: what the agent is asked to do."""
    image: str
    """`[environment] docker_image`: the environment the agent works in, and the tests' root;
    empty when it is built from `environment/` (`context`)."""
    context: Path | None = None
    """environment/, when the image is built from its Dockerfile (`stasis task build`)."""
    build_timeout_s: float = DEFAULT_TIMEOUT_S
    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    egress: tuple[str, ...] = ()
    """`[agent] allowed_hosts`: where the agent may connect besides the model gateway."""
    tests: dict[str, bytes] = field(default_factory=dict)
    """tests/, by path below it: copied to /tests for the verifier alone."""
    solution: dict[str, bytes] = field(default_factory=dict)
    """solution/, by path below it: what the oracle agent runs (solve.sh)."""


def load_task(directory: Path) -> Task:
    """Read and check a task directory; InvalidArgument names the file and field at fault."""
    if not directory.is_dir():
        raise InvalidArgument("task", f"{directory} is not a directory")
    config = _toml(directory / "task.toml")
    agent, verifier, environment = (_table(config, key) for key in ("agent", "verifier", "environment"))
    name = _string(_table(config, "task"), "[task] name", directory.resolve().name)
    instruction = _text(directory / "instruction.md")
    tests = _tree(directory, "tests")
    if "test.sh" not in tests:
        raise InvalidArgument("task.tests", f"{directory / 'tests' / 'test.sh'} is missing; Harbor runs it")
    _refuse(agent, "agent", ("user",), "the agent runs as the environment image's USER")
    _refuse(verifier, "verifier", ("user",), "the tests run as the environment image's USER")
    _refuse(verifier, "verifier", ("environment_mode",), "the tests always run in a sandbox of their own")
    _refuse(verifier, "verifier", ("allowed_hosts",), "the tests' sandbox has no network")
    _refuse(environment, "environment", ("gpus", "gpu_types", "tpu"), "Stasis places no accelerators")
    image = _image(directory, environment)
    return Task(
        name=name,
        instruction=instruction,
        image=image,
        context=None if image else directory / "environment",
        build_timeout_s=_seconds(environment, "[environment] build_timeout_sec"),
        agent_timeout_s=_seconds(agent, "[agent] timeout_sec"),
        verifier_timeout_s=_seconds(verifier, "[verifier] timeout_sec"),
        verifier_env=_env(verifier),
        egress=_egress(agent),
        resources=_resources(environment),
        tests=tests,
        solution=_tree(directory, "solution") if (directory / "solution").exists() else {},
    )


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument("task.toml", f"{path} is not valid TOML: {exc}") from None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InvalidArgument(f"task.{path.name}", f"{path} is missing") from None
    except OSError as exc:
        raise InvalidArgument(f"task.{path.name}", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"task.{path.name}", f"{path} is not UTF-8 text: {exc.reason}") from None


def _table(config: dict[str, Any], key: str) -> dict[str, Any]:
    table = config.get(key, {})
    if not isinstance(table, dict):
        raise InvalidArgument(f"task.toml [{key}]", "must be a table")
    return table


def _string(table: dict[str, Any], what: str, default: str) -> str:
    value = table.get(what.split()[-1], default)
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"task.toml {what}", "must be a non-empty string")
    return value


def _refuse(table: dict[str, Any], name: str, keys: tuple[str, ...], why: str) -> None:
    for key in keys:
        if table.get(key) not in (None, "", [], 0, "root"):
            raise InvalidArgument(f"task.toml [{name}] {key}", f"is not supported by Stasis yet: {why}")


def _seconds(table: dict[str, Any], what: str) -> float:
    value = table.get(what.split()[-1], DEFAULT_TIMEOUT_S)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 < value <= MAX_SECONDS)
    ):
        raise InvalidArgument(
            f"task.toml {what}", f"{value!r} must be a number of seconds > 0 and <= {MAX_SECONDS}"
        )
    return float(value)


def _env(verifier: dict[str, Any]) -> dict[str, str]:
    env = verifier.get("env", {})
    if not isinstance(env, dict):
        raise InvalidArgument("task.toml [verifier] env", "must be a table of strings")
    for key, value in env.items():
        if not _ENV_KEY.fullmatch(key):
            raise InvalidArgument(
                f"task.toml [verifier] env.{key}", "is not a valid environment variable name"
            )
        if not isinstance(value, str) or "\0" in value:
            raise InvalidArgument(f"task.toml [verifier] env.{key}", "must be a string without NUL bytes")
    return dict(env)


def _egress(agent: dict[str, Any]) -> tuple[str, ...]:
    hosts = agent.get("allowed_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise InvalidArgument("task.toml [agent] allowed_hosts", "must be a list of strings")
    if problem := egress_problem(hosts):
        raise InvalidArgument(f"task.toml [agent] allowed_hosts[{problem[0]}]", problem[1])
    return tuple(hosts)


def _image(directory: Path, environment: dict[str, Any]) -> str:
    """`docker_image`, or "" for an image built from environment/Dockerfile."""
    image = environment.get("docker_image")
    if image is None:
        dockerfile = directory / "environment" / "Dockerfile"
        if not dockerfile.is_file() or dockerfile.is_symlink():
            raise InvalidArgument(
                "task.toml [environment] docker_image", f"is not set, and there is no {dockerfile} to build"
            )
        return ""
    if not isinstance(image, str) or not image.strip():
        raise InvalidArgument("task.toml [environment] docker_image", "must be a non-empty string")
    return image


def _resources(environment: dict[str, Any]) -> Resources:
    default = Resources()
    fields = {"cpus": "cpus", "memory_mb": "memory_mb", "disk_mb": "storage_mb"}
    values: dict[str, Any] = {}
    for ours, theirs in fields.items():
        value = environment.get(theirs, getattr(default, ours))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"task.toml [environment] {theirs}", f"{value!r} is not a number")
        values[ours] = value if ours == "cpus" else int(value)
    resources = Resources(**values)
    if problem := resource_problem(resources):
        raise InvalidArgument(f"task.toml [environment] {fields[problem[0]]}", problem[1])
    return resources


def _tree(directory: Path, name: str) -> dict[str, bytes]:
    """Every regular file below directory/name, by its path there. A symlink is refused: what
    it points at may lie outside the task."""
    root = directory / name
    if not root.is_dir() or root.is_symlink():
        raise InvalidArgument(f"task.{name}", f"{root} is not a directory")
    files, total = {}, 0
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise InvalidArgument(f"task.{name}", f"{name}/{relative} is a symlink; copy the file it names")
        if path.is_file():
            files[relative] = path.read_bytes()
            total += len(files[relative])
    if total > MAX_FILES_BYTES:
        raise InvalidArgument(f"task.{name}", f"holds {total} bytes; the limit is {MAX_FILES_BYTES}")
    return files


def digest_tree(h: hashlib._Hash, root: Path) -> None:
    """Feed `h` every file below `root` (its path, mode, size and bytes) and every symlink (its
    target), in path order; a `root` that is a file is that one file."""
    for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            h.update(f"link {relative} {os.readlink(path)}\0".encode())
        elif path.is_file():
            stat = path.stat()
            h.update(f"file {relative} {stat.st_mode & 0o7777:o} {stat.st_size}\0".encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)


def context_digest(task: Task, build_args: dict[str, str]) -> str:
    """The sha256 of a task's build context (environment/: every file's path, mode and bytes)
    and its build arguments: an image built from the same digest is the same image."""
    if task.context is None:
        raise InvalidArgument(
            "task", f"task {task.name!r} names docker_image {task.image!r}; there is nothing to build"
        )
    h = hashlib.sha256()
    digest_tree(h, task.context)
    for key, value in sorted(build_args.items()):
        h.update(f"arg {key}={value}\0".encode())
    return h.hexdigest()
