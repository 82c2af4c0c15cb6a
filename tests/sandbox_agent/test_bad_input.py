"""Bad requests get an error naming what is wrong, and no running sandbox is harmed."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_agent import (
    AlreadyExists,
    CheckpointCorrupt,
    ImageMismatch,
    InvalidSpec,
    Node,
    NotFound,
    Phase,
    PhaseHooks,
    SandboxSpec,
    SandboxState,
)
from sandbox_agent.errors import CommandFailed
from sandbox_agent.spec import Resources
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log


@pytest.fixture
def busy_node(make_node: NodeFactory, tmp_path: Path) -> Iterator[tuple[Node, Node, Path]]:
    """Node a runs a sandbox that must stay unharmed; its checkpoint lies in tmp_path/ck."""
    a, b = make_node("node-a"), make_node("node-b")
    a.create("victim", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "4")))
    wait_for_log(a, "victim", lambda t: "sha " in t)
    a.checkpoint("victim", tmp_path / "ck", leave_running=True)
    yield a, b, tmp_path / "ck"
    assert a.get("victim").state == SandboxState.RUNNING
    before = a.harness_log("victim").count(b"sha ")
    wait_for_log(a, "victim", lambda t: t.count("sha ") > before)


@pytest.mark.timeout(90)
def test_unknown_image(busy_node: tuple[Node, Node, Path]) -> None:
    a, _, _ = busy_node
    with pytest.raises(
        NotFound, match=r"image 'no-such-image' is not in this node's image cache; cached images: base"
    ):
        a.create("x", SandboxSpec(image="no-such-image", command=("true",)))
    assert [s.record.id for s in a.list()] == ["victim"]


@pytest.mark.timeout(90)
def test_checkpoint_of_another_image_digest(busy_node: tuple[Node, Node, Path], tmp_path: Path) -> None:
    _, b, ck = busy_node
    base = b.images.resolve("base")
    other_tree = tmp_path / "other"
    subprocess.run(["cp", "-a", str(base.rootfs), str(other_tree)], check=True)  # the tree has device nodes
    (other_tree / "etc" / "issue").write_text("another image\n")
    other = b.images.import_directory(other_tree, name="other")
    assert other.digest != base.digest
    with pytest.raises(ImageMismatch) as err:
        b.restore("victim", ck, image="other")
    assert base.digest in str(err.value) and other.digest in str(err.value)
    assert b.list() == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "damage",
    [
        "truncate",
        "flip",
        "drop-metadata",
        "drop-layer",
        "garble-metadata",
        "escaping-inventory",
        "bad-created-at",
    ],
)
def test_damaged_checkpoint(busy_node: tuple[Node, Node, Path], tmp_path: Path, damage: str) -> None:
    _, b, ck = busy_node
    bad = tmp_path / "bad"
    shutil.copytree(ck, bad)
    pages = max((bad / "criu").glob("pages-*.img"), key=lambda p: p.stat().st_size)
    if damage == "truncate":
        with open(pages, "r+b") as f:
            f.truncate(pages.stat().st_size // 2)
        expected = r"pages-\d+\.img is \d+ bytes, expected \d+"
    elif damage == "flip":
        with open(pages, "r+b") as f:
            f.seek(4096)
            byte = f.read(1)
            f.seek(4096)
            f.write(bytes([byte[0] ^ 0xFF]))
        expected = r"pages-\d+\.img does not match its recorded sha256"
    elif damage == "drop-metadata":
        (bad / "checkpoint.json").unlink()
        expected = "checkpoint.json is missing"
    elif damage == "drop-layer":
        (bad / "layer.tar").unlink()
        expected = "file layer.tar is missing"
    elif damage == "escaping-inventory":  # an inventory that would stat the node's own files
        body = json.loads((bad / "checkpoint.json").read_text())
        body["files"]["../../../etc/shadow"] = {"size": 1, "sha256": "00"}
        (bad / "checkpoint.json").write_text(json.dumps(body))
        expected = "files names '../../../etc/shadow', not a path inside the checkpoint"
    elif damage == "bad-created-at":
        body = json.loads((bad / "checkpoint.json").read_text())
        body["created_at"] = "yesterday"
        (bad / "checkpoint.json").write_text(json.dumps(body))
        expected = "lacks a field or has a wrong one"
    else:
        (bad / "checkpoint.json").write_text("{not json")
        expected = "is not valid JSON"
    with pytest.raises(CheckpointCorrupt, match=expected):
        b.restore("victim", bad)
    assert b.list() == []
    # The intact checkpoint still restores.
    b.restore("victim", ck)
    assert b.get("victim").state == SandboxState.RUNNING


@pytest.mark.timeout(90)
def test_restore_same_checkpoint_twice_into_one_id(busy_node: tuple[Node, Node, Path]) -> None:
    _, b, ck = busy_node
    b.restore("twice", ck)
    pid = b.get("twice").pid
    with pytest.raises(AlreadyExists, match="sandbox 'twice' already exists on node node-b"):
        b.restore("twice", ck)
    assert b.get("twice").state == SandboxState.RUNNING
    assert b.get("twice").pid == pid


@pytest.mark.timeout(90)
def test_checkpoint_into_existing_destination(busy_node: tuple[Node, Node, Path]) -> None:
    a, _, ck = busy_node
    with pytest.raises(AlreadyExists, match="already exists"):
        a.checkpoint("victim", ck, leave_running=False)


INVALID_REQUESTS = [
    ("Bad/Id", SandboxSpec(image="base", command=("true",)), {}, "sandbox_id"),
    ("ok", SandboxSpec(image="base", command=()), {}, "command"),
    ("ok", SandboxSpec(image="base", command=("true",), env={"1BAD": "x"}), {}, "env[1BAD]"),
    ("ok", SandboxSpec(image="base", command=("true",), address="300.1.1.1"), {}, "address"),
    ("ok", SandboxSpec(image="base", command=("true",), address="127.0.0.1"), {}, "address"),
    ("ok", SandboxSpec(image="base", command=("true",), hostname="Not_Valid"), {}, "hostname"),
    (
        "ok",
        SandboxSpec(image="base", command=("true",), resources=Resources(memory_mb=1)),
        {},
        "resources.memory_mb",
    ),
    ("ok", SandboxSpec(image="base", command=("true",), resources=Resources(cpus=0)), {}, "resources.cpus"),
    ("ok", SandboxSpec(image="base", command=("true",)), {"relative/path": b""}, "files[relative/path]"),
    (
        "ok",
        SandboxSpec(image="base", command=("true",)),
        {"/../../etc/passwd": b""},
        "files[/../../etc/passwd]",
    ),
    ("ok", SandboxSpec(image="base", command=("true",), cwd="tmp"), {}, "cwd"),
    ("ok", SandboxSpec(image="base", command=("true",)), {"/etc/a\0b": b""}, "files[/etc/a\0b]"),
    ("ok\n", SandboxSpec(image="base", command=("true",)), {}, "sandbox_id"),
    ("victim", SandboxSpec(image="", command=("true",)), {}, "image"),
]


@pytest.mark.timeout(90)
def test_invalid_spec_names_the_field(busy_node: tuple[Node, Node, Path]) -> None:
    a, _, _ = busy_node
    for sandbox_id, spec, files, field in INVALID_REQUESTS:
        with pytest.raises(InvalidSpec) as err:
            a.create(sandbox_id, spec, files)
        assert err.value.field == field, f"{spec} with {files}: {err.value}"
    assert [s.record.id for s in a.list()] == ["victim"]


@pytest.mark.timeout(90)
def test_unknown_sandbox(busy_node: tuple[Node, Node, Path], tmp_path: Path) -> None:
    a, b, _ = busy_node
    for call in (lambda: a.get("ghost"), lambda: a.kill("ghost"), lambda: a.delete("ghost")):
        with pytest.raises(NotFound, match="sandbox 'ghost' does not exist on node node-a"):
            call()
    # An id that would reach outside the sandboxes' directory (into a layer a harness controls).
    for ghost in ("victim/layer/upper", "../sandboxes/victim", "/tmp"):
        for call in (a.get, a.kill, a.delete):
            with pytest.raises(InvalidSpec, match="sandbox_id"):
                call(ghost)
    with pytest.raises(NotFound, match="does not exist"):
        b.restore("x", tmp_path / "nowhere")


@pytest.mark.timeout(120)
def test_phase_hooks_see_each_phase_and_a_failed_phase_leaves_the_sandbox_running(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    seen: list[Phase] = []
    fail_before = {Phase.LAYER}

    def before(phase: Phase, sandbox_id: str) -> None:
        if phase in fail_before:
            fail_before.clear()
            raise InvalidSpec("hook", f"refused {phase} of {sandbox_id}")

    def after(phase: Phase, sandbox_id: str, ms: float) -> None:
        assert sandbox_id == "hooked" and ms >= 0
        seen.append(phase)

    node = make_node("node-h", hooks=PhaseHooks(before=before, after=after))
    node.create("hooked", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "4")))
    wait_for_log(node, "hooked", lambda t: "sha " in t)
    with pytest.raises(InvalidSpec, match="refused layer of hooked"):
        node.checkpoint("hooked", tmp_path / "refused", leave_running=False)
    # Stopping kills the sandbox as its memory is dumped (CRIU freezes it); the failure after
    # that revived it from the images, with its memory, not restarted.
    assert seen == [Phase.DUMP, Phase.FROZEN, Phase.NODE_FREE]
    assert node.get("hooked").state == SandboxState.RUNNING and not (tmp_path / "refused").exists()
    revived = node.harness_log("hooked").count(b"sha ")
    log = wait_for_log(node, "hooked", lambda t: t.count("sha ") > revived)
    assert log.count("start") == 1, log

    seen.clear()
    taken = node.checkpoint("hooked", tmp_path / "ck", leave_running=True)
    assert seen == [Phase.FREEZE, Phase.DUMP, Phase.LAYER, Phase.FROZEN, Phase.DURABLE]
    assert {p.key for p in seen} | {Phase.TOTAL.key} == set(taken.timings_ms)
    assert taken.timings_ms["frozen_ms"] >= taken.timings_ms["dump_ms"]
    before_count = node.harness_log("hooked").count(b"sha ")
    wait_for_log(node, "hooked", lambda t: t.count("sha ") > before_count)


UNDUMPABLE = r"""
import os, time
# An open file, deleted, of more than CRIU's 1 MiB ghost-file limit: CRIU refuses to dump it.
f = open("/tmp/held", "wb")
f.write(b"x" * (2 << 20))
f.flush()
os.unlink("/tmp/held")
n = 0
while True:
    n += 1
    print("tick", n, flush=True)
    time.sleep(0.05)
"""


@pytest.mark.timeout(120)
def test_a_stopping_checkpoint_criu_refuses_leaves_the_sandbox_running(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    node = make_node("node-u")
    node.create("held", SandboxSpec(image="base", command=("python3", "-c", UNDUMPABLE)))
    wait_for_log(node, "held", lambda t: "tick 2" in t)
    with pytest.raises(CommandFailed, match="CRIU dump of sandbox held failed") as failed:
        node.checkpoint("held", tmp_path / "refused", leave_running=False)
    assert "ghost" in str(failed.value), "the error carries CRIU's own reason"
    # Neither killed nor left frozen, with no mark that a restarted agent would revive it by.
    status = node.get("held")
    assert status.state == SandboxState.RUNNING and not status.busy
    assert not (tmp_path / "refused").exists() and not list(
        node.settings.root.glob("sandboxes/held/stopped*")
    )
    ticks = node.harness_log("held").count(b"tick ")
    wait_for_log(node, "held", lambda t: t.count("tick ") > ticks + 2)
    node.delete("held")


@pytest.mark.timeout(90)
def test_an_image_whose_state_dir_is_a_symlink_is_refused_and_the_node_dir_keeps_its_owner(
    busy_node: tuple[Node, Node, Path], tmp_path: Path
) -> None:
    """The node makes /.stasis in each layer and gives it to the sandbox's user: through a symlink
    in the image, that would hand a node directory to an unprivileged host uid."""
    a, _, _ = busy_node
    tree = tmp_path / "linked"
    shutil.copytree(a.images.resolve("base").rootfs, tree, symlinks=True)
    target = tmp_path / "node-dir"
    target.mkdir(mode=0o700)
    (tree / ".stasis").symlink_to(target)
    a.images.import_directory(tree, name="linked")
    with pytest.raises(InvalidSpec, match=r"/\.stasis is not a directory") as err:
        a.create("linked", SandboxSpec(image="linked", command=("true",), user="1000:1000"))
    assert err.value.field == "image"
    assert (target.stat().st_uid, target.stat().st_mode & 0o777) == (0, 0o700)
    assert [s.record.id for s in a.list()] == ["victim"]


@pytest.mark.timeout(90)
def test_a_socket_where_the_exit_code_goes_does_not_take_the_node_down(
    busy_node: tuple[Node, Node, Path],
) -> None:
    """A harness that leaves a socket at /.stasis/exit-code (which open() refuses with ENXIO) is
    read as having no exit code; listing the node, which every heartbeat does, still works."""
    a, _, _ = busy_node
    binds = (
        "import socket; socket.socket(socket.AF_UNIX).bind('/.stasis/exit-code'); print('bound', flush=True)"
    )
    a.create("sock", SandboxSpec(image="base", command=("python3", "-c", binds)))
    wait_for_log(a, "sock", lambda t: "bound" in t)
    deadline = time.monotonic() + 30
    while a.get("sock").state != SandboxState.EXITED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert a.get("sock").exit_code is None
    assert {s.record.id for s in a.list()} == {"victim", "sock"}
    a.delete("sock")
