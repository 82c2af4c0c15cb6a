"""Images from a real registry on a node: pulled with skopeo (digests verified), checked, unpacked
with umoci; the image config honoured (env, workdir, non-root user, cmd); a non-root harness
checkpointed on one node and restored on another that pulls the image for the restore."""

from __future__ import annotations

import itertools
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.stasis.v1 import agent_pb2 as pb
from protos.stasis.v1 import agent_pb2_grpc as pb_grpc
from sandbox_agent import ImageRejected, NotFound, SandboxSpec, SandboxState, serve
from sandbox_agent.images.oci import Reference, RegistryAccess, resolve
from tests.oci_images import harness_image, member, with_layer
from tests.registry import Registry
from tests.sandbox_agent.conftest import NodeFactory, remove_node_dirs, wait_for_log

HARNESS = """#!/bin/sh
echo "uid=$(id -u) gid=$(id -g) pwd=$(pwd) mode=$HARNESS_MODE home=$HOME extra=$EXTRA"
i=0
while true; do i=$((i+1)); echo "tick $i"; echo $i > ticks; sleep 0.2; done
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OCI layout with the harness image and the bad images built from it."""
    root = tmp_path_factory.mktemp("oci")
    layout = root / "layout"
    harness_image(layout, "harness", {"/usr/local/bin/harness.sh": HARNESS})
    with_layer(layout, "harness", "dotdot", [member("../../escaped")])
    with_layer(layout, "harness", "symlink", [member("etc/evil", tarfile.SYMTYPE, "../../../../etc/shadow")])
    with_layer(layout, "harness", "device", [member("home/agent/disk", tarfile.BLKTYPE, device=(8, 0))])
    return layout


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, layout: Path) -> Iterator[Registry]:
    r = Registry(tmp_path_factory.mktemp("registry"))
    for tag in ("harness", "dotdot", "symlink", "device"):
        r.push(layout, tag, f"stasis/{tag}")
    yield r
    r.stop()


@pytest.mark.timeout(240)
def test_a_registry_image_runs_as_its_config_says_and_restores_on_a_node_that_pulls_it(
    make_node: NodeFactory, registry: Registry, tmp_path: Path
) -> None:
    a, b = make_node("node-a"), make_node("node-b", image_cache=tmp_path / "b-images")
    tagged = f"{registry.host}/stasis/harness:1"
    pinned = Reference.parse(tagged).pinned(resolve(tagged, a.registry))  # type: ignore[union-attr]
    status = a.create("img", SandboxSpec(image=pinned, env={"EXTRA": "from-spec"}, address="10.201.0.7"))
    assert status.record.timings_ms["pull_ms"] > 0, "the pull is timed as a phase of its own"
    log = wait_for_log(a, "img", lambda t: "tick 3" in t)
    assert "uid=1000 gid=1000 pwd=/home/agent/work mode=image home=/home/agent extra=from-spec" in log
    assert status.record.spec.command == ("/bin/sh", "/usr/local/bin/harness.sh")
    assert pinned in {n for i in a.images.list() for n in i.names}

    # A non-root harness, checkpointed here and restored on a node that has never seen the image.
    a.checkpoint("img", tmp_path / "ck", leave_running=False)
    remove_node_dirs(a)
    assert not b.images.list() or pinned not in {n for i in b.images.list() for n in i.names}
    restored = b.restore("img-2", tmp_path / "ck")
    assert restored.state == SandboxState.RUNNING and restored.record.timings_ms["pull_ms"] > 0
    after = wait_for_log(b, "img-2", lambda t: t.count("tick") > log.count("tick") + 3)
    assert after.count("uid=1000") == 1, "the process went on; it did not start again"


@pytest.mark.timeout(120)
def test_a_pull_over_grpc_streams_its_bytes_then_the_image(
    make_node: NodeFactory, registry: Registry, tmp_path: Path
) -> None:
    server, port = serve(make_node("node-p", image_cache=tmp_path / "images"), "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SandboxAgentStub(channel)

            def pull(tag: str) -> Iterator[pb.PullProgress]:
                request = pb.PullImageRequest(name=f"p-{tag}", reference=f"{registry.host}/stasis/{tag}:1")
                return stub.PullImage(request, timeout=100)  # type: ignore[no-any-return]

            first = list(pull("harness"))
            fetching = [m for m in first if m.phase == "fetching"]
            assert [m.phase for m in first if m.phase != "fetching"] == ["waiting", "unpacking", "done"]
            assert fetching[-1].bytes_done == fetching[-1].bytes_total > 0, "every blob's bytes, then 100%"
            assert all(a.bytes_done <= b.bytes_done for a, b in itertools.pairwise(fetching))
            assert "p-harness" in first[-1].image.names and first[-1].image.digest.startswith("sha256:")
            assert [m.phase for m in pull("harness")] == ["waiting", "done"], "a cached image is not fetched"

            # The same layers plus a bad one: what the node holds counts from the first report on,
            # and the refusal ends the stream with the layer's error.
            heard: list[pb.PullProgress] = []
            with pytest.raises(grpc.RpcError) as err:
                for m in pull("dotdot"):
                    heard.append(m)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "'..' path component" in str(err.value.details())
            assert heard[1].phase == "fetching" and heard[1].bytes_done >= fetching[-1].bytes_total // 2
    finally:
        server.stop(None)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("tag", "words"),
    [
        ("dotdot", "has a '..' path component"),
        ("symlink", "escapes the image root"),
        ("device", "is a device node"),
    ],
)
def test_unsafe_layers_are_refused_naming_the_image_and_layer(
    make_node: NodeFactory, registry: Registry, tag: str, words: str
) -> None:
    node = make_node("node-a")
    before = node.images.list()
    ref = f"{registry.host}/stasis/{tag}:1"
    with pytest.raises(ImageRejected) as err:
        node.images.pull(ref, node.registry)
    assert words in str(err.value) and ref in str(err.value) and "layer sha256:" in str(err.value)
    assert node.images.list() == before, "nothing of it is in the cache"
    assert not [p for p in node.images.root.iterdir() if p.name.startswith(".import-")]


@pytest.mark.timeout(120)
def test_unknown_images_and_corrupt_blobs_are_refused(
    make_node: NodeFactory, registry: Registry, tmp_path: Path, layout: Path
) -> None:
    # A cache of its own: a blob the node already holds is not fetched again, so not checked again.
    node = make_node("node-a", image_cache=tmp_path / "images")
    with pytest.raises(ImageRejected, match=r"stasis/nothing-here"):
        node.images.pull(f"{registry.host}/stasis/nothing-here:1", node.registry)
    with pytest.raises(NotFound):
        node.create("x", SandboxSpec(image="not-cached-and-not-a-reference", command=("true",)))
    # Flip bytes in a stored layer blob: the registry serves it, skopeo's digest check refuses it.
    broken = Registry(tmp_path / "broken")
    try:
        ref = broken.push(layout, "harness", "stasis/broken")
        biggest = max(broken.blobs().glob("*/*/data"), key=lambda p: p.stat().st_size)
        data = bytearray(biggest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        biggest.write_bytes(bytes(data))
        with pytest.raises(ImageRejected, match=r"stasis/broken"):
            node.images.pull(ref, node.registry)
    finally:
        broken.stop()


@pytest.fixture
def host_address() -> Iterator[str]:
    """An address on this host that is not loopback, on a veth made for the test."""
    link, address = "stxreg0", "10.254.77.1"
    subprocess.run(["ip", "link", "del", link], capture_output=True)
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", "stxreg1"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        yield address
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)


@pytest.mark.timeout(120)
def test_a_registry_off_loopback_needs_tls_unless_listed_insecure(
    make_node: NodeFactory, tmp_path: Path, layout: Path, host_address: str
) -> None:
    plain = Registry(tmp_path / "plain", address=host_address)
    try:
        ref = plain.push(layout, "harness", "team/harness")
        node = make_node("node-a", image_cache=tmp_path / "images")
        with pytest.raises(ImageRejected, match=r"team/harness"):
            node.images.pull(ref, RegistryAccess())
        assert node.images.pull(ref, RegistryAccess(insecure=(plain.host,))).config.user == "agent"
    finally:
        plain.stop()


@pytest.mark.timeout(180)
def test_a_tls_registry_with_basic_auth(
    make_node: NodeFactory, tmp_path: Path, layout: Path, host_address: str
) -> None:
    secure = Registry(tmp_path / "secure", user="trainer", password="s3cret", address=host_address)
    try:
        ref = secure.push(layout, "harness", "team/harness")
        good = RegistryAccess(auth_file=secure.auth_file(), certs_dir=secure.certs_dir())
        node = make_node("node-a")
        with pytest.raises(ImageRejected) as err:
            node.images.pull(
                ref, RegistryAccess(auth_file=secure.auth_file("wrong"), certs_dir=secure.certs_dir())
            )
        assert ref in str(err.value) and "s3cret" not in str(err.value) and "wrong" not in str(err.value)
        with pytest.raises(ImageRejected):
            node.images.pull(ref, RegistryAccess(auth_file=secure.auth_file()))  # no CA: TLS is refused
        image = node.images.pull(ref, good)
        assert image.config.user == "agent" and image.config.working_dir == "/home/agent/work"
    finally:
        secure.stop()
