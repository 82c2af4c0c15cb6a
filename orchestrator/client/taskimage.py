"""A Harbor task's images, imported into the cluster (`StasisClient.import_image`):

* its environment, built from environment/ with the local Docker engine ($DOCKER_HOST, else its
  default socket), as the Dockerfile says, nothing added (`ensure_image`);
* that environment with an agent laid over it (`ensure_agent_image`): the environment's image
  copied from the cluster's registry with skopeo, and one more layer of the agent's files
  added with umoci, as Harbor installs an agent into a task's container. The environment's own
  layers stay as they are, and the tests' root is the environment alone.

Each name holds a digest of what made the image (the build context and arguments; the
environment's digest and the agent's files): what the cluster has already is not made again,
and any change makes a new image under a new name.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.client.imagesource import registry_flags, tool_runner
from orchestrator.domain import InvalidArgument, StasisError
from orchestrator.task import Task, TaskAgent, context_digest, digest_tree

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


def ensure_agent_image(
    client: StasisClient, environment: str, agent: TaskAgent, progress: Callable[[str], None] = lambda _: None
) -> str:
    """The name of the environment image `environment` (a name in the cluster's catalogue) with
    `agent.layer` over it, made and imported unless the cluster has it already."""
    found = {i.name: i for i in client.images()}
    if environment not in found:
        raise InvalidArgument("image", f"{environment!r} is not in the cluster's images (stasis image ls)")
    base = found[environment]
    h = hashlib.sha256(base.digest.encode())
    for target, source in sorted(agent.layer.items()):
        root = Path(os.path.realpath(source))  # laid as what it names (`_write_layer`)
        if not root.exists():
            raise InvalidArgument(
                "agent", f"agent {agent.name}'s {target} comes from {source}, which does not exist"
            )
        h.update(f"\0{target}\0".encode())
        digest_tree(h, root)
    name = f"{environment[:80]}-{agent.name[:20]}-{h.hexdigest()[:12]}"
    if name in found:
        progress(f"{name} is {environment} with {agent.name} already")
        return name
    progress(f"laying {agent.name} over {environment}")
    with tempfile.TemporaryDirectory(prefix="stasis-agent-image-") as tmp:
        layout = f"{tmp}/layout"
        copy = ["skopeo", "copy", *registry_flags(base.reference, "src")]
        tool_runner(f"copying {environment} from the registry")(
            [*copy, f"docker://{base.reference}", f"oci:{layout}:image"]
        )
        layer = f"{tmp}/layer.tar"
        _write_layer(layer, agent.layer)
        tool_runner(f"adding {agent.name}'s layer")(
            ["umoci", "raw", "add-layer", "--image", f"{layout}:image", layer]
        )
        client.import_image(name, layout, progress)
    return name


def _write_layer(path: str, layer: dict[str, str]) -> None:
    """A layer archive of `layer`'s files at their paths in the image, owned by root (a
    directory's symlinks stay links), with the directories above each. Written here rather than
    by `umoci insert`, whose archives end short of tar's end blocks."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        parents: set[str] = set()
        for target, source in sorted(layer.items()):
            parts = target.strip("/").split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in parents:
                    parents.add(parent)
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            tar.add(os.path.realpath(source), arcname="/".join(parts), filter=owned_by_root)
