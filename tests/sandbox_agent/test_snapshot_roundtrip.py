"""A real checkpoint goes through the snapshot store (local dir and S3) and restores a running process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent import Phase, PhaseHooks, SandboxSpec, SandboxState
from sandbox_agent.criu import images as criu_images
from sandbox_agent.errors import FailedPrecondition
from sandbox_agent.host import overlay
from sandbox_agent.node import SnapshotTarget
from snapshots import ManifestMismatch, SnapshotCorrupt, SnapshotStore, import_checkpoint_archive
from tests.s3server import MotoServer
from tests.sandbox_agent import programs
from tests.sandbox_agent.conftest import NodeFactory, recorded, remove_node_dirs, staged, wait_for_log
from tests.snapshots.conftest import damage, forge_manifest, make_meta, replace_manifest


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return f"file://{tmp_path}/store"
    moto: MotoServer = request.getfixturevalue("moto_server")
    bucket = f"roundtrip-{len(request.node.name)}-{abs(hash(request.node.name)) % 10_000}"
    moto.create_bucket(bucket)
    return f"s3://{bucket}/snapshots?endpoint={moto.endpoint}"


@pytest.mark.timeout(180)
def test_checkpoint_through_the_store(make_node: NodeFactory, store_url: str) -> None:
    a = make_node("node-a", snapshot_store=store_url)
    b = make_node("node-b", snapshot_store=store_url)
    spec = SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "32"), address="10.203.0.2")
    a.create("ep1-r1", spec)
    log = wait_for_log(a, "ep1-r1", lambda t: t.count("sha ") >= 2)
    sha = re.findall(r"sha (\w+)", log)[-1]

    first, m1 = a.checkpoint_to_store(
        "ep1-r1",
        SnapshotTarget("ep1-s1", "ep1", 1, "autosave", trajectory_cursor={"turn": 3}),
        leave_running=True,
    )
    assert a.get("ep1-r1").state == SandboxState.RUNNING
    _, m2 = a.checkpoint_to_store(
        "ep1-r1", SnapshotTarget("ep1-s2", "ep1", 2, "time-slice", parent_id="ep1-s1"), leave_running=False
    )
    assert first.timings_ms["frozen_ms"] > 0 and first.timings_ms["put_ms"] > 0 and m1.sizes.stored_bytes > 0
    assert "store_upload" in first.timings_ms and m1.timings_ms["dump_ms"] == first.timings_ms["dump_ms"]
    assert m2.parent_id == "ep1-s1" and m1.trajectory_cursor == {"turn": 3}
    # Most of the second snapshot's memory is the first's: the store keeps it once.
    assert m2.sizes.new_bytes < m1.sizes.stored_bytes / 2
    assert not list((a.settings.root / "staging").iterdir()), "staging must be empty after a commit"
    remove_node_dirs(a)

    restored = b.restore_from_store("ep1-r2", "ep1-s2", m2.digest)
    assert restored.record.timings_ms["fetch_ms"] > 0
    assert restored.record.restored_from == "ep1-s2", "the snapshot, not a staging path"
    after = wait_for_log(b, "ep1-r2", lambda t: t.count("sha ") > log.count("sha ") + 1)
    assert re.findall(r"sha (\w+)", after)[-1] == sha
    assert after.count("start") == 1
    deadline = time.monotonic() + 30
    while b.get("ep1-r2").busy:  # restored lazily: its memory arrives after it runs
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert b.get("ep1-r2").record.timings_ms["resident_ms"] >= restored.record.timings_ms["restore_ms"]
    assert not staged(b)


@pytest.mark.timeout(120)
def test_corrupt_chunk_fails_the_restore(make_node: NodeFactory, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=url), make_node("node-b", snapshot_store=url)
    a.create("c1", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "4")))
    wait_for_log(a, "c1", lambda t: "sha " in t)
    a.checkpoint_to_store("c1", SnapshotTarget("c-s1", "c", 1, "manual"), leave_running=True)
    with SnapshotStore.open(url) as store:
        biggest = max(
            (r for e in store.manifest("c-s1").files() for r in e.chunks), key=lambda r: r.stored_length
        )
    damage(tmp_path / "store", biggest)
    # The damaged chunk is memory: a lazy restore runs the sandbox, meets the chunk as it
    # arrives and removes the sandbox; the next try here fetches the snapshot whole and fails.
    try:
        b.restore_from_store("c1", "c-s1", recorded(b, "c-s1"))
    except SnapshotCorrupt as exc:  # met while the restore was finishing
        assert "c-s1" in str(exc)
    deadline = time.monotonic() + 30
    while b.list():
        assert time.monotonic() < deadline, "the sandbox on damaged memory was not removed"
        time.sleep(0.05)
    # Under a new id, as the control plane restores: the old one may stay busy a moment after
    # it left the list, until its removal has finished.
    with pytest.raises(SnapshotCorrupt, match="c-s1"):
        b.restore_from_store("c1-again", "c-s1", recorded(b, "c-s1"))
    assert b.list() == []
    assert a.get("c1").state == SandboxState.RUNNING
    with SnapshotStore.open(url) as store:
        assert not store.verify("c-s1").ok


@pytest.mark.timeout(60)
@pytest.mark.parametrize("link", ["criu/pagemap-1.img", "layer.tar"])
def test_a_snapshot_with_a_symlink_is_refused_before_the_restore_touches_anything(
    make_node: NodeFactory, tmp_path: Path, link: str
) -> None:
    """No node writes a symlink into a checkpoint; one in a shared store must not have the restore,
    which runs as root, chmod, unpack or read the node file it points at."""
    secret = tmp_path / "node-secret"
    secret.write_text("the node's own file")
    secret.chmod(0o600)
    tree = tmp_path / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "checkpoint.json").write_text("{}")
    (tree / link).symlink_to(secret)
    url = f"file://{tmp_path}/store"
    with SnapshotStore.open(url) as store:
        store.put(tree, make_meta("linked-1"))
    node = make_node("node-a", snapshot_store=url)
    with pytest.raises(SnapshotCorrupt, match=f"linked-1.*{link}.*is a symlink"):
        node.restore_from_store("linked", "linked-1", recorded(node, "linked-1"))
    assert node.list() == [] and not staged(node)
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.read_text() == "the node's own file"


@pytest.mark.timeout(120)
def test_a_manifest_replaced_in_the_store_is_refused_before_the_restore_reads_anything(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """Issue 45, F8: a writer with the store's credentials replaces a snapshot's manifest with one
    whose checkpoint.json has CRIU restore the sandbox without its user namespace and seccomp
    (every chunk of it sound). The node, given the digest recorded at the checkpoint, refuses it
    naming the snapshot, before it stages, unpacks or runs anything; and refuses a restore
    from the store that names no digest."""
    url = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=url), make_node("node-b", snapshot_store=url)
    a.create("f1", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "4")))
    wait_for_log(a, "f1", lambda t: "sha " in t)
    _, taken = a.checkpoint_to_store("f1", SnapshotTarget("f-s1", "f", 1, "manual"), leave_running=True)
    with SnapshotStore.open(url) as store:
        evil = store.fetch("f-s1", tmp_path / "evil")
        checkpoint = json.loads((evil_dir := tmp_path / "evil" / "checkpoint.json").read_text())
        checkpoint["oci_spec"]["linux"].pop("seccomp", None)
        checkpoint["oci_spec"]["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 0, "size": 1}]
        evil_dir.write_text(json.dumps(checkpoint))
        assert evil.digest == taken.digest
        replace_manifest(store, "f-s1", forge_manifest(store, tmp_path / "evil", "f-s1"))

    with pytest.raises(ManifestMismatch, match=r"f-s1.*replaced") as caught:
        b.restore_from_store("f2", "f-s1", taken.digest)
    assert caught.value.expected == taken.digest
    assert b.list() == [] and not staged(b)
    with pytest.raises(FailedPrecondition, match=r"f-s1.*no manifest digest"):
        b.restore_from_store("f2", "f-s1", "")
    assert b.list() == [] and not staged(b)
    assert a.get("f1").state == SandboxState.RUNNING


def _userns_image(uid_lower: int, gid_lower: int) -> bytes:
    """A CRIU userns image (criu/images/userns.proto) mapping ids 0..65535 to these host ids."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def extent(lower: int) -> bytes:
        return b"\x08\x00\x10" + varint(lower) + b"\x18" + varint(65536)

    entry = b"".join(
        tag + varint(len(e)) + e for tag, e in ((b"\x0a", extent(uid_lower)), (b"\x12", extent(gid_lower)))
    )
    return struct.pack("<III", criu_images.IMG_COMMON_MAGIC, criu_images.USERNS_MAGIC, len(entry)) + entry


@pytest.mark.timeout(120)
def test_images_that_would_restore_a_task_outside_the_sandboxs_user_namespace_are_refused(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """Issue 45, F8, what a recorded digest cannot stop: the node that took a snapshot wrote its
    CRIU images, and CRIU recreates the user namespace they describe. A map of uid 0 to host
    root, or a task left without its namespace, is refused naming the snapshot before CRIU
    runs, wherever the snapshot is restored; the honest images restore."""
    url = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=url), make_node("node-b", snapshot_store=url)
    a.create("u1", SandboxSpec(image="base", command=("sh", "-c", "echo ready; exec sleep 600")))
    wait_for_log(a, "u1", lambda t: "ready" in t)
    a.checkpoint_to_store("u1", SnapshotTarget("u-s1", "u", 1, "manual"), leave_running=True)
    with SnapshotStore.open(url) as store:
        honest = store.fetch("u-s1", tmp_path / "honest")
        (userns,) = (tmp_path / "honest" / "criu").glob("userns-*.img")
        assert userns.read_bytes() == _userns_image(100000, 100000), "the map the node imposes"
        forgeries: dict[str, Callable[[Path], object]] = {
            "root": lambda image: image.write_bytes(_userns_image(0, 100000)),
            "gone": lambda image: image.unlink(),
        }
        forged = {}
        for name, forge in forgeries.items():
            shutil.copytree(tmp_path / "honest", tmp_path / name)
            forge(tmp_path / name / "criu" / userns.name)
            # The forging node writes the checkpoint's inventory to match.
            meta = json.loads((tmp_path / name / "checkpoint.json").read_text())
            meta["files"].pop(f"criu/{userns.name}")
            (tmp_path / name / "checkpoint.json").write_text(json.dumps(meta))
            forged[name] = store.put(tmp_path / name, make_meta(f"u-{name}", episode_id="u", seq=2)).digest
    for name, digest in forged.items():
        with pytest.raises(SnapshotCorrupt, match=rf"u-{name}.*would not restore as a sandbox's") as caught:
            b.restore_from_store("u2", f"u-{name}", digest)
        assert (
            "uids [(0, 0, 65536)]" in str(caught.value)
            if name == "root"
            else "is missing" in str(caught.value)
        )
        assert b.list() == [] and not staged(b)
    assert b.restore_from_store("u2", "u-s1", honest.digest).state == SandboxState.RUNNING


DIRTY_TENTH = r"""
import random, signal, time
size, asked = 64 << 20, []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
buf = bytearray(random.Random(2).randbytes(size))
print("ready", flush=True)
while not asked:
    time.sleep(0.05)
# Dirty a tenth of the memory in 16 stretches spread over the buffer.
rng, stretch = random.Random(3), size // 10 // 16
for i in range(16):
    start = i * (size // 16)
    buf[start:start + stretch] = rng.randbytes(stretch)
print("changed", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.timeout(180)
def test_snapshot_after_a_tenth_of_memory_changed_adds_little(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("node-a", snapshot_store=f"file://{tmp_path}/store")
    node.create("dirty", SandboxSpec(image="base", command=("python3", "-c", DIRTY_TENTH)))
    wait_for_log(node, "dirty", lambda t: "ready" in t)
    _, first = node.checkpoint_to_store(
        "dirty", SnapshotTarget("d-s1", "d", 1, "autosave"), leave_running=True
    )
    node.kill("dirty", signal.SIGUSR1)
    wait_for_log(node, "dirty", lambda t: "changed" in t)
    _, second = node.checkpoint_to_store(
        "dirty", SnapshotTarget("d-s2", "d", 2, "autosave", parent_id="d-s1"), leave_running=True
    )
    share = second.sizes.new_bytes / first.sizes.stored_bytes
    print(
        f"first snapshot stored {first.sizes.stored_bytes} bytes; the second added {second.sizes.new_bytes} ({share:.1%})"
    )
    assert share <= 0.25


SCATTERED = r"""
import hashlib, random, signal, time
rng, asked, done = random.Random(4), [], 0
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
words = [b"observation %d of the run " % i for i in range(977)]
heap = bytearray(b"".join(rng.choice(words) for _ in range(700_000)))  # about 16 MiB, as a heap
print("ready", flush=True)
while True:
    if len(asked) > done:
        done += 1
        for page in range(0, len(heap) // 4096, 8):  # 16 bytes in every 8th page
            at = page * 4096 + rng.randrange(4080)
            heap[at:at + 16] = rng.randbytes(16)
        print("changed", done, flush=True)
    print("sha", hashlib.sha256(heap).hexdigest(), done, flush=True)
    time.sleep(0.2)
"""


@pytest.mark.timeout(180)
def test_scattered_changes_are_stored_as_deltas_and_restore_lazily(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """One page in eight of a heap changed since the parent: every chunk of it changed, and each
    is stored against its parent's copy; the restored sandbox reads them back through its base."""
    url = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=url), make_node("node-b", snapshot_store=url)
    a.create("heap", SandboxSpec(image="base", command=("python3", "-c", SCATTERED)))
    wait_for_log(a, "heap", lambda t: "sha" in t)
    _, first = a.checkpoint_to_store("heap", SnapshotTarget("h-s1", "h", 1, "autosave"), leave_running=True)
    a.kill("heap", signal.SIGUSR1)
    log = wait_for_log(a, "heap", lambda t: re.search(r"sha \w+ 1", t))
    _, second = a.checkpoint_to_store(
        "heap", SnapshotTarget("h-s2", "h", 2, "time-slice", parent_id="h-s1"), leave_running=False
    )
    pages = max((e for e in second.files() if e.path.startswith("criu/pages-")), key=lambda e: e.size)
    deltas = [c for c in pages.chunks if c.base is not None]
    print(
        f"{len(deltas)} of {len(pages.chunks)} chunks are deltas; the second snapshot added "
        f"{second.sizes.new_bytes} bytes to the first's {first.sizes.stored_bytes}"
    )
    assert len(deltas) > len(pages.chunks) // 4
    assert second.sizes.new_bytes < first.sizes.stored_bytes / 4
    sha = re.findall(r"sha (\w+) 1", log)[-1]

    restored = b.restore_from_store("heap", "h-s2", recorded(b, "h-s2"))
    assert restored.busy, "lazily: the deltas arrive through the page server"
    # The log came along: lines after the restore are the ones past those before the dump.
    seen = len(re.findall(r"sha \w+ 1", log))
    after = wait_for_log(b, "heap", lambda t: len(re.findall(r"sha \w+ 1", t)) >= seen + 3, timeout=60)
    assert set(re.findall(r"sha (\w+) 1", after)) == {sha}
    with SnapshotStore.open(url) as store:
        assert store.verify("h-s2").ok


@pytest.mark.timeout(120)
def test_standard_archive_round_trip_restores(make_node: NodeFactory, tmp_path: Path) -> None:
    """Export to the kubelet/CRI-O/Podman checkpoint archive, import it back, restore it elsewhere."""
    url = f"file://{tmp_path}/store"
    a, b = make_node("node-a", snapshot_store=url), make_node("node-b")
    a.create("arc", SandboxSpec(image="base", command=("python3", "-c", programs.FILES)))
    log = wait_for_log(a, "arc", lambda t: t.count("view ") >= 2)
    a.checkpoint_to_store("arc", SnapshotTarget("arc-s1", "arc", 1, "manual"), leave_running=False)
    with SnapshotStore.open(url) as store:
        archive = store.export_archive("arc-s1", tmp_path / "arc.tar")
    imported = import_checkpoint_archive(archive, tmp_path / "imported")
    b.restore("arc", imported, verify=False)
    after = wait_for_log(b, "arc", lambda t: t.count("view ") >= log.count("view ") + 2)
    assert set(re.findall(r"view (\w+ \d+)", after)) == set(re.findall(r"view (\w+ \d+)", log)[-1:])


@pytest.mark.timeout(120)
def test_a_failed_upload_after_the_kill_revives_the_sandbox(make_node: NodeFactory, tmp_path: Path) -> None:
    def refuse(phase: Phase, sandbox_id: str) -> None:
        if phase == Phase.PUT:
            raise OSError(28, "No space left on device")

    url = f"file://{tmp_path}/store"
    a = make_node("node-a", snapshot_store=url, hooks=PhaseHooks(before=refuse))
    a.create("up", SandboxSpec(image="base", command=("python3", "-c", programs.MEMORY, "16")))
    log = wait_for_log(a, "up", lambda t: t.count("sha ") >= 2)
    sha = re.findall(r"sha (\w+)", log)[-1]
    with pytest.raises(OSError, match="No space left"):
        a.checkpoint_to_store("up", SnapshotTarget("up-s1", "up", 1, "preempt"), leave_running=False)
    assert a.get("up").state == SandboxState.RUNNING
    logged = a.harness_log("up").count(b"sha ")
    after = wait_for_log(a, "up", lambda t: t.count("sha ") > logged + 1)
    assert re.findall(r"sha (\w+)", after)[-1] == sha and after.count("start") == 1, (
        "its memory, not a restart"
    )
    with SnapshotStore.open(url) as store:
        assert not store.exists("up-s1")
    assert not list((a.settings.root / "staging").iterdir())


@pytest.mark.timeout(60)
def test_a_snapshots_log_is_read_as_a_window_even_when_the_harness_made_it_terabytes(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """A harness's log comes from its snapshot's layer for an episode no longer live; a sparse log
    of a terabyte (a few bytes in the layer) must not be written out whole to read its tail."""
    layer = tmp_path / "layer"
    (layer / ".stasis").mkdir(parents=True)
    log = layer / ".stasis" / "harness.log"
    with open(log, "wb") as f:
        f.truncate(1 << 40)
        f.seek((1 << 40) - 6)
        f.write(b"tail!\n")
    tree = tmp_path / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "checkpoint.json").write_text("{}")
    subprocess.run(["tar", "--sparse", "-cf", str(tree / "layer.tar"), "-C", str(layer), "."], check=True)
    assert (tree / "layer.tar").stat().st_size < 1 << 20
    url = f"file://{tmp_path}/store"
    with SnapshotStore.open(url) as store:
        store.put(tree, make_meta("sparse-1"))
    node = make_node("node-a", snapshot_store=url)
    assert node.snapshot_log("sparse-1", tail_bytes=6) == (b"tail!\n", 1 << 40)
    assert node.snapshot_log("sparse-1", offset=4096) == (bytes(4 << 20), 1 << 40)


def _bytes_read() -> int:
    """What this process has read so far (/proc/self/io rchar): every read(2) and pread(2), the
    local store's among them."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


@pytest.mark.timeout(120)
def test_a_page_of_a_snapshots_log_fetches_only_the_part_of_the_layer_it_reads(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    """The layer holds 64 MiB of other files ahead of a 22 MiB log; a page of 4 MiB of the log
    reads the tar's headers and the chunks under the page (about 2 MiB as stored), never the
    rest of the layer nor the rest of the log."""
    layer = tmp_path / "layer"
    (layer / ".stasis").mkdir(parents=True)
    (layer / "dataset.bin").write_bytes(os.urandom(64 << 20))
    log = os.urandom(11 << 20).hex().encode()  # Stored at about half its size, as logs are.
    (layer / ".stasis" / "harness.log").write_bytes(log)
    tree = tmp_path / "tree"
    (tree / "criu").mkdir(parents=True)
    (tree / "checkpoint.json").write_text("{}")
    # As an agent before this one archived it: the log's place in the tar is wherever it fell.
    subprocess.run(
        ["tar", "-cf", str(tree / "layer.tar"), "-C", str(layer), "./dataset.bin", "./.stasis"], check=True
    )
    url = f"file://{tmp_path}/store"
    with SnapshotStore.open(url) as store:
        store.put(tree, make_meta("big-1"))
    node = make_node("node-a", snapshot_store=url)
    node.snapshot_log("big-1", tail_bytes=1)  # Opens the store, whose first use reads more.

    pages = {
        "from 8 MiB": ({"offset": 8 << 20}, log[8 << 20 : 12 << 20]),
        "the last 4 MiB": ({"tail_bytes": 4 << 20}, log[-(4 << 20) :]),
    }
    for name, (where, expected) in pages.items():
        before = _bytes_read()
        assert node.snapshot_log("big-1", **where) == (expected, len(log))
        read = _bytes_read() - before
        assert read < 6 << 20, f"the page {name} read {read / (1 << 20):.1f} MiB of an 86 MiB layer"


@pytest.mark.timeout(30)
def test_a_layer_is_archived_with_its_state_dir_first_and_everything_else_once(tmp_path: Path) -> None:
    """So a log page finds the log in the archive's first headers."""
    upper = tmp_path / "upper"
    for path in ("a/f", "a/.stasis/g", "z/h", ".stasis/harness.log"):
        (upper / path).parent.mkdir(parents=True, exist_ok=True)
        (upper / path).write_text(path)
    overlay.export_layer(upper, tmp_path / "layer.tar", first="/.stasis")
    with tarfile.open(tmp_path / "layer.tar") as tar:
        names = tar.getnames()
    assert names[:2] == ["./.stasis", "./.stasis/harness.log"]
    assert sorted(names) == sorted(
        [".", "./.stasis", "./.stasis/harness.log", "./a", "./a/f", "./a/.stasis", "./a/.stasis/g",
         "./z", "./z/h"]
    )  # fmt: skip
    shutil.rmtree(upper / ".stasis")
    overlay.export_layer(upper, tmp_path / "without.tar", first="/.stasis")
    with tarfile.open(tmp_path / "without.tar") as tar:
        assert "./a/.stasis/g" in tar.getnames()
