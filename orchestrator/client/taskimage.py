"""A Harbor task's environment image, built from its environment/ with the local Docker engine
($DOCKER_HOST, else its default socket) and imported into the cluster (`StasisClient.import_image`).

Its name holds the digest of the build context and the build arguments (`context_digest`):
a context already imported under that name is not built again, and any change to a file of
environment/ or to an argument builds a new image under a new name. The Dockerfile is built as
it is; nothing is added to it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.domain import StasisError
from orchestrator.task import Task, context_digest

if TYPE_CHECKING:
    from orchestrator.client.client import StasisClient


def image_name(task: Task, digest: str) -> str:
    """The cluster's name for the task's image built from a context of that digest."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip("-._")[:80] or "task"
    return f"task-{slug}-{digest[:16]}"


def ensure_image(
    client: StasisClient,
    task: Task,
    build_args: dict[str, str],
    progress: Callable[[str], None] = lambda _: None,
    *,
    rebuild: bool = False,
) -> tuple[str, bool]:
    """The name of the task's image in the cluster, built and imported unless it is there
    already (or `rebuild`); and whether it was built now."""
    digest = context_digest(task, build_args)
    name = image_name(task, digest)
    if not rebuild and any(i.name == name for i in client.images()):
        progress(f"{name} is the image of this build context already")
        return name, False
    assert task.context is not None  # context_digest refused a task without one
    tag = f"stasis-task/{name}:latest"
    argv = ["docker", "build", "-t", tag, "-f", str(task.context / "Dockerfile")]
    for key, value in sorted(build_args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    progress(f"building {task.context} as {tag}")
    # The builder inside the engine: BuildKit's would need the buildx plugin on this machine.
    env = {"DOCKER_BUILDKIT": "0", **os.environ}
    try:
        built = subprocess.run(
            [*argv, str(task.context)], capture_output=True, text=True, env=env, timeout=task.build_timeout_s
        )
    except subprocess.TimeoutExpired:
        raise StasisError(f"building {task.context} ran past [environment] build_timeout_sec") from None
    except FileNotFoundError:
        raise StasisError("building a task's environment needs the docker command on this machine") from None
    if built.returncode != 0:
        tail = "\n".join((built.stdout + built.stderr).strip().splitlines()[-8:])
        raise StasisError(f"building {task.context} failed:\n{tail}")
    try:
        client.import_image(name, f"docker://{tag}", progress)
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True, env=env)
    return name, True
