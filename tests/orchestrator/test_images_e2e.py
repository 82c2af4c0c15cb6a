"""Registry images end to end, through the local stack and the `stasis` program.

The real Docker engine builds a harness image (the base image plus ENV, WORKDIR and a non-root
USER) and pushes it to a real registry. An episode names it by tag: the tag is pinned at submit,
the harness runs as the image says, is preempted, and restores on a node that pulls the image
first; `stasis logs` shows its output from both runs, in order. `stasis image import` takes every
kind of source and gives the same tree the same digest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import InvalidArgument
from orchestrator.cli.local import LocalStack
from tests.dockerd import docker
from tests.orchestrator.conftest import cli, wait_until
from tests.registry import Registry

DOCKERFILE = """FROM stasis-test/base:1
RUN useradd --create-home --uid 4321 agent && mkdir -p /home/agent/work && chown agent:agent /home/agent/work
COPY harness.sh /usr/local/bin/harness.sh
ENV HARNESS_MODE=image
WORKDIR /home/agent/work
USER agent
CMD ["/bin/sh", "/usr/local/bin/harness.sh"]
"""

HARNESS = """#!/bin/sh
echo "uid=$(id -u) pwd=$(pwd) mode=$HARNESS_MODE extra=$EXTRA"
i=0
while true; do i=$((i+1)); echo "tick $i"; echo $i > ticks; sleep 0.2; done
"""


def _docker(url: str, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return docker(url, *args, check=True, timeout=timeout, env={**os.environ, "DOCKER_BUILDKIT": "0"})


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    r = Registry(tmp_path_factory.mktemp("registry"))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pushed(
    dockerd: str, docker_base: str, registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """`docker build` of a harness image and `docker push` of it to the registry; its tag."""
    context = tmp_path_factory.mktemp("build")
    (context / "Dockerfile").write_text(DOCKERFILE)
    (context / "harness.sh").write_text(HARNESS)
    tag = f"{registry.host}/team/harness:v1"
    _docker(dockerd, "build", "--network", "none", "-t", tag, str(context), timeout=300)
    _docker(dockerd, "push", tag, timeout=300)
    _docker(dockerd, "rmi", tag)
    return tag


def _logs(stack: LocalStack, episode_id: str, *flags: str) -> str:
    return cli(stack, "logs", episode_id, *flags).stdout


def _ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]


@pytest.mark.timeout(420)
def test_a_pushed_image_runs_by_tag_as_its_config_says_and_restores_where_it_must_be_pulled(
    make_stack: Callable[..., LocalStack], pushed: str, registry: Registry
) -> None:
    stack = make_stack(nodes=2, slots=1, shared_image_cache=False)
    with stack.client() as c:
        with pytest.raises(InvalidArgument) as err:
            c.submit({"image": f"{registry.host}/team/nothing:v1"})
        assert err.value.field == "spec.image" and "team/nothing" in str(err.value)
        assert c.episodes() == [], "a refused pull stores nothing"

        e = c.submit({"image": pushed, "env": {"EXTRA": "from-spec"}})
        assert re.fullmatch(rf"{re.escape(registry.host)}/team/harness@sha256:[0-9a-f]{{64}}", e.spec.image)
        c.wait(e.id, ["RUNNING"], timeout_s=180)
        first = c.get(e.id).node
        started = [ev.reason for ev in c.events(e.id) if ev.to_state == "RUNNING"]
        assert any("pulled" in m for m in started), started
        wait_until(lambda: len(_ticks(_logs(stack, e.id))) >= 3, 60, "ticks in the log")
        assert "uid=4321 pwd=/home/agent/work mode=image extra=from-spec" in _logs(stack, e.id)

        c.preempt(e.id, "move it")
        c.wait(e.id, ["PREEMPTED"], timeout_s=120)
        before = _ticks(_logs(stack, e.id))
        assert before, "a preempted episode's log is read from its snapshot"
        other = "node-2" if first == "node-1" else "node-1"
        c.resume(e.id, other)
        c.wait(e.id, ["RUNNING"], timeout_s=180)
        restored = [ev.reason for ev in c.events(e.id) if ev.from_state == "RESTORING"][-1]
        assert f"restored on {other}" in restored and "pull" in restored, restored
        wait_until(lambda: len(_ticks(_logs(stack, e.id))) > len(before) + 3, 60, "ticks after restore")

        whole = _ticks(_logs(stack, e.id))
        assert whole == list(range(1, len(whole) + 1)), "one harness, counting on across nodes, in order"
        run1, run2 = _logs(stack, e.id, "--run", "1"), _logs(stack, e.id, "--run", "2")
        assert _ticks(run1) == before and _ticks(run2)[0] == before[-1] + 1
        c.cancel(e.id)


def _tree(root: Path) -> Path:
    """A small root filesystem with what makes digests differ: modes, owners, a link, a subdir."""
    tree = root / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (tree / "bin" / "tool").chmod(0o755)
    (tree / "etc").mkdir()
    (tree / "etc" / "tool.conf").write_text("level=3\n")
    (tree / "etc" / "tool.conf").chmod(0o640)
    os.chown(tree / "etc" / "tool.conf", 0, 42)
    (tree / "link").symlink_to("bin/tool")
    tree.chmod(0o755)
    return tree


@pytest.mark.timeout(420)
def test_stasis_image_import_takes_every_kind_of_source_and_the_same_tree_gets_one_digest(
    make_stack: Callable[..., LocalStack], dockerd: str, tmp_path: Path
) -> None:
    stack = make_stack(nodes=2, slots=1, shared_image_cache=False)
    tree = _tree(tmp_path)
    tree_tar = tmp_path / "tree.tar"
    subprocess.run(["tar", "--numeric-owner", "-C", str(tree), "-cf", str(tree_tar), "."], check=True)
    layout = tmp_path / "layout"
    for argv in (
        ["umoci", "init", "--layout", str(layout)],
        ["umoci", "new", "--image", f"{layout}:tool"],
        ["umoci", "insert", "--image", f"{layout}:tool", str(tree), "/"],
    ):
        subprocess.run(argv, check=True, capture_output=True)
    oci_tar = tmp_path / "layout.tar"
    subprocess.run(["tar", "-C", str(layout), "-cf", str(oci_tar), "."], check=True)
    docker_tar = tmp_path / "docker.tar"
    _docker(dockerd, "import", str(tree_tar), "stasis-test/tool:1")
    try:
        _docker(dockerd, "save", "-o", str(docker_tar), "stasis-test/tool:1")
        sources = {
            "from-dir": str(tree),
            "from-layout": str(layout),
            "from-oci-tar": str(oci_tar),
            "from-docker-tar": str(docker_tar),
            "from-docker": "docker://stasis-test/tool:1",
        }
        env = {"DOCKER_HOST": dockerd}
        digests = {}
        for name, source in sources.items():
            result = cli(stack, "image", "import", name, source, env=env)
            assert result.stdout.startswith(f"{name} sha256:"), result.stdout + result.stderr
            assert "pushing" in result.stderr, "progress goes to stderr"
            assert all(f"{n}: fetching" in result.stderr for n in ("node-1", "node-2")), result.stderr
            assert all(f"{n}: done" in result.stderr for n in ("node-1", "node-2")), result.stderr
            digests[name] = result.stdout.split()[1]
    finally:
        docker(dockerd, "rmi", "-f", "stasis-test/tool:1")
    assert len(set(digests.values())) == 1, digests

    listed = json.loads(cli(stack, "image", "ls", "-o", "json").stdout)["items"]
    assert {i["name"]: i["nodes"] for i in listed} == {n: ["node-1", "node-2"] for n in sources}
    table = cli(stack, "image", "ls").stdout
    assert table.splitlines()[0].split() == ["NAME", "DIGEST", "SIZE", "NODES", "SOURCE"]

    bad = cli(stack, "image", "import", "broken", str(tmp_path / "missing"), check=False)
    assert bad.returncode != 0 and "source" in bad.stderr and "missing" in bad.stderr
    cli(stack, "image", "rm", "from-dir")
    gone = cli(stack, "image", "rm", "from-dir", check=False)
    assert gone.returncode != 0 and "from-dir" in gone.stderr
    assert "from-dir" not in {i.name for i in stack.client().images()}
