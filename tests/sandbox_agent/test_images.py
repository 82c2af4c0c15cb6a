"""The image cache: imports from a directory, a tarball and Docker agree on one content digest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import docker
import pytest

from sandbox_agent import InvalidSpec, SandboxSpec
from sandbox_agent.runtime.docker_backend import import_docker_image
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log


@pytest.mark.timeout(180)
def test_same_tree_same_digest_from_every_source(
    make_node: NodeFactory, dockerd: str, tmp_path: Path
) -> None:
    node = make_node("node-a")
    base = node.images.resolve("base")
    tar = tmp_path / "base.tar"
    subprocess.run(
        ["tar", "-C", str(base.rootfs), "--xattrs", "--numeric-owner", "-cf", str(tar), "."], check=True
    )
    from_tar = node.images.import_tarball(tar, name="from-tar")
    from_dir = node.images.import_directory(base.rootfs, name="from-dir")
    assert from_tar.digest == from_dir.digest == base.digest

    client = docker.DockerClient(base_url=dockerd)
    try:
        with open(tar, "rb") as f:
            client.api.import_image(src=f.read(), repository="stasis-test/fromtar", tag="1")
        from_docker = import_docker_image(node.images, "stasis-test/fromtar:1", "from-docker", dockerd)
    finally:
        client.images.remove("stasis-test/fromtar:1", force=True)
        client.close()
    # Docker adds its own mount points (/.dockerenv, /etc/hosts, ...), so the tree and digest differ.
    assert from_docker.digest != base.digest
    assert "from-docker" in from_docker.names
    node.create("d", SandboxSpec(image="from-docker", command=("python3", "-c", "print('in docker image')")))
    wait_for_log(node, "d", lambda t: "in docker image" in t)


@pytest.mark.timeout(30)
def test_import_errors_name_the_source(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("node-a")
    with pytest.raises(InvalidSpec, match="tarball"):
        node.images.import_tarball(tmp_path / "missing.tar")
    with pytest.raises(InvalidSpec, match="directory"):
        node.images.import_directory(tmp_path / "missing")
