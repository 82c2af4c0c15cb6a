"""`stasis image import` sources, pushed to the cluster's import registry with skopeo:

* a directory: an OCI layout (it has an `oci-layout` file) or a root filesystem tree, which
  umoci packs into a one-layer image, owners and modes kept;
* a tarball: an OCI layout (`oci-layout` inside) or a `docker save` archive (`manifest.json`);
* docker://IMAGE: an image of the local Docker engine ($DOCKER_HOST, else its default socket);
* a registry reference host/repo:tag: nothing to push, the nodes pull it as it is.

The registry then holds the layers once; each node fetches only those it lacks.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.domain import InvalidArgument, StasisError
from protos.shared.address import host_of

DOCKER = "docker://"


def is_registry_reference(source: str) -> bool:
    return "/" in source and not source.startswith((DOCKER, "/", ".")) and not Path(source).exists()


@contextmanager
def skopeo_source(source: str) -> Iterator[str]:
    """The skopeo transport:reference for a local SOURCE; InvalidArgument names what is wrong."""
    if source.startswith(DOCKER):
        image = source.removeprefix(DOCKER)
        if not image:
            raise InvalidArgument("source", "docker:// needs an image, e.g. docker://harness:latest")
        yield f"docker-daemon:{image if ':' in image.rsplit('/', 1)[-1] else image + ':latest'}"
        return
    path = Path(source).resolve()
    if path.is_dir():
        if (path / "oci-layout").is_file():
            yield f"oci:{path}"
            return
        with tempfile.TemporaryDirectory(prefix="stasis-import-") as tmp:
            yield _pack_tree(path, Path(tmp) / "layout")
        return
    if path.is_file():
        try:
            with tarfile.open(path) as tar:
                names = {n.removeprefix("./") for n in tar.getnames()[:10000]}
        except (tarfile.TarError, OSError) as exc:
            raise InvalidArgument("source", f"{source} is not a tarball: {exc}") from None
        if "oci-layout" in names:
            yield f"oci-archive:{path}"
        elif "manifest.json" in names:
            yield f"docker-archive:{path}"
        else:
            raise InvalidArgument(
                "source", f"{source} is neither an OCI-layout tarball nor a docker-save archive"
            )
        return
    raise InvalidArgument(
        "source", f"{source!r} is no directory, tarball, docker://IMAGE or registry reference host/repo:tag"
    )


def _pack_tree(tree: Path, layout: Path) -> str:
    """A root filesystem tree as a one-layer OCI image (umoci keeps owners, modes and xattrs)."""
    run = tool_runner("packing the directory into an image")
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:image"])
    run(["umoci", "insert", "--image", f"{layout}:image", str(tree), "/"])
    return f"oci:{layout}:image"


def _loopback(host: str) -> bool:
    try:
        name = host_of(host, "registry")
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def registry_flags(registry: str, side: str) -> list[str]:
    """skopeo's flags for `registry` (host[:port], or a reference on it) as its "src" or "dest":
    plain HTTP on loopback, TLS elsewhere; $REGISTRY_AUTH_FILE's credentials if set."""
    flags = [f"--{side}-tls-verify={'false' if _loopback(registry.split('/')[0]) else 'true'}"]
    if auth := os.environ.get("REGISTRY_AUTH_FILE"):
        flags += [f"--{side}-authfile", auth]
    return flags


def push(source: str, registry: str, repository: str, progress: Callable[[str], None]) -> str:
    """Copy SOURCE to registry/repository:latest; returns that reference. On a terminal skopeo
    draws its progress bars; otherwise each blob it copies is an event line."""
    target = f"{registry}/{repository}:latest"
    with skopeo_source(source) as src:
        argv = ["skopeo", "copy", *registry_flags(registry, "dest")]
        docker_host = os.environ.get("DOCKER_HOST")
        if docker_host and src.startswith("docker-daemon:"):
            argv += ["--src-daemon-host", docker_host]
        progress(f"pushing {source} to {target}")
        tty = sys.stderr.isatty()
        proc = subprocess.Popen(
            [*argv, src, f"docker://{target}"],
            stdout=None if tty else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if not tty and proc.stdout is not None:
            for line in proc.stdout:
                if line.strip():
                    progress(line.strip())
        _, err = proc.communicate()
        if proc.returncode != 0:
            detail = (err.strip().splitlines() or [f"skopeo exited {proc.returncode}"])[-1]
            raise StasisError(f"pushing {source} to {target} failed: {detail}")
    return target


def tool_runner(what: str) -> Callable[[list[str]], None]:
    def run(argv: list[str]) -> None:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            detail = (r.stderr.strip().splitlines() or [f"{argv[0]} exited {r.returncode}"])[-1]
            raise StasisError(f"{what}: {detail}")

    return run
