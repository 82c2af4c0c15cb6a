"""Standard checkpoint archive export/import, checked against real GNU tar on a real overlay-style layer."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from snapshots import (
    InvalidCheckpoint,
    SnapshotStore,
    export_checkpoint_archive,
    import_checkpoint_archive,
)
from tests.snapshots.conftest import make_meta

TAR_XATTRS = ["--xattrs", "--xattrs-include=*", "--numeric-owner"]
OCI_SPEC = {"ociVersion": "1.0.2", "process": {"args": ["python3", "harness.py"]}, "root": {"path": "rootfs"}}


def build_upper(upper: Path) -> None:
    """An overlay upper dir as a sandbox leaves it: new files, whiteouts, an opaque dir, links, xattrs."""
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    os.chown(upper / "etc" / "hosts", 1000, 1001)
    os.chmod(upper / "etc" / "hosts", 0o640)
    os.mknod(upper / "etc" / "deleted.conf", stat.S_IFCHR, os.makedev(0, 0))
    (upper / "workspace" / "cache").mkdir(parents=True)
    os.setxattr(upper / "workspace" / "cache", "trusted.overlay.opaque", b"y")
    (upper / "workspace" / "cache" / "fresh.bin").write_bytes(os.urandom(5000))
    (upper / "workspace" / "main.py").write_text("print('hi')\n")
    os.chmod(upper / "workspace" / "main.py", 0o755)
    os.setxattr(upper / "workspace" / "main.py", "user.stasis.note", b"kept")
    os.setxattr(upper / "workspace" / "main.py", "user.binary", b"\x00\xff\x10binary")
    os.setxattr(upper / "workspace", "trusted.overlay.origin", b"\x00node-local")
    os.link(upper / "workspace" / "main.py", upper / "workspace" / "main-hardlink.py")
    os.symlink("../etc/hosts", upper / "workspace" / "hosts-link")
    os.mknod(upper / "workspace" / "gone", stat.S_IFCHR, os.makedev(0, 0))
    (upper / "tmp").mkdir(mode=0o1777)
    os.chmod(upper / "tmp", 0o1777)


def make_checkpoint(root: Path, upper: Path) -> Path:
    """A checkpoint directory in the agent's layout, with layer.tar made by GNU tar from upper."""
    (root / "criu").mkdir(parents=True)
    (root / "criu" / "pages-1.img").write_bytes(os.urandom(100_000))
    (root / "criu" / "inventory.img").write_bytes(b"inventory")
    (root / "criu" / "descriptors.json").write_text('["/dev/null"]')
    (root / "criu" / "stats-dump").write_bytes(b"\x01stats")
    subprocess.run(["tar", *TAR_XATTRS, "-cf", str(root / "layer.tar"), "-C", str(upper), "."], check=True)
    checkpoint = {
        "oci_spec": OCI_SPEC,
        "image_digest": "sha256:" + "cd" * 32,
        "backend": "runc",
        "criu_version": "4.2.1",
        "sandbox_id": "sb-42",
        "created_at": "2026-05-01T12:00:00+00:00",
        "config": {"name": "episode-7", "image": "harness:latest"},
    }
    (root / "checkpoint.json").write_text(json.dumps(checkpoint))
    return root


def describe(root: Path) -> dict[str, tuple[object, ...]]:
    """Type, mode, owner, device, link target, content and xattrs of every entry; hardlinks by inode group."""
    out: dict[str, tuple[object, ...]] = {}
    inodes: dict[int, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        st = path.lstat()
        xattrs = {} if stat.S_ISLNK(st.st_mode) else {n: os.getxattr(path, n) for n in os.listxattr(path)}
        content: object = None
        if stat.S_ISREG(st.st_mode):
            content = path.read_bytes()
            if st.st_nlink > 1:
                content = ("hardlink-group", inodes.setdefault(st.st_ino, rel), content)
        elif stat.S_ISLNK(st.st_mode):
            content = os.readlink(path)
        elif stat.S_ISCHR(st.st_mode):
            content = ("chr", os.major(st.st_rdev), os.minor(st.st_rdev))
        out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, content, xattrs)
    return out


def gnu_extract(tar: Path, dest: Path) -> Path:
    dest.mkdir()
    subprocess.run(["tar", *TAR_XATTRS, "-xpf", str(tar), "-C", str(dest)], check=True)
    return dest


@pytest.mark.timeout(60)
def test_export_is_a_standard_archive_gnu_tar_reads(scratch: Path) -> None:
    upper = scratch / "upper"
    build_upper(upper)
    checkpoint = make_checkpoint(scratch / "ckpt", upper)
    archive = export_checkpoint_archive(checkpoint, scratch / "dump.tar")

    listing = subprocess.run(
        ["tar", "-tf", str(archive)], check=True, capture_output=True, text=True
    ).stdout.split()
    for member in ("config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files", "stats-dump"):
        assert member in listing
    assert {"checkpoint/pages-1.img", "checkpoint/inventory.img", "checkpoint/descriptors.json"} <= set(
        listing
    )

    unpacked = gnu_extract(archive, scratch / "unpacked")
    config = json.loads((unpacked / "config.dump").read_text())
    assert config["id"] == "sb-42" and config["name"] == "episode-7"
    assert config["rootfsImageRef"] == "sha256:" + "cd" * 32 and config["rootfsImageName"] == "harness:latest"
    assert config["runtime"] == "runc" and config["restored"] is False
    assert config["checkpointedTime"] == "2026-05-01T12:00:00Z" and config["restoredTime"].startswith(
        "0001-01-01"
    )
    assert json.loads((unpacked / "spec.dump").read_text()) == OCI_SPEC
    assert sorted(json.loads((unpacked / "deleted.files").read_text())) == [
        "/etc/deleted.conf",
        "/workspace/gone",
    ]
    assert (unpacked / "stats-dump").read_bytes() == b"\x01stats"

    # The layer, as an OCI consumer sees it: whiteout files, opaque marker, no node-local overlay xattrs.
    rootfs = gnu_extract(unpacked / "rootfs-diff.tar", scratch / "rootfs")
    assert (rootfs / "etc" / ".wh.deleted.conf").is_file()
    assert (rootfs / "workspace" / ".wh.gone").is_file()
    assert (rootfs / "workspace" / "cache" / ".wh..wh..opq").is_file()
    assert not (rootfs / "etc" / "deleted.conf").exists()
    for path in [rootfs, *rootfs.rglob("*")]:
        if not path.is_symlink():
            assert not [n for n in os.listxattr(path) if n.startswith("trusted.overlay.")], path
    assert os.getxattr(rootfs / "workspace" / "main.py", "user.stasis.note") == b"kept"
    assert os.getxattr(rootfs / "workspace" / "main.py", "user.binary") == b"\x00\xff\x10binary"
    assert (
        os.stat(rootfs / "workspace" / "main.py").st_ino
        == os.stat(rootfs / "workspace" / "main-hardlink.py").st_ino
    )
    assert os.readlink(rootfs / "workspace" / "hosts-link") == "../etc/hosts"
    assert (os.stat(rootfs / "etc" / "hosts").st_uid, os.stat(rootfs / "etc" / "hosts").st_gid) == (
        1000,
        1001,
    )


@pytest.mark.timeout(60)
def test_export_import_round_trip_restores_overlay_layer(scratch: Path) -> None:
    upper = scratch / "upper"
    build_upper(upper)
    os.removexattr(upper / "workspace", "trusted.overlay.origin")  # Stripped by design; compare without it.
    checkpoint = make_checkpoint(scratch / "ckpt", upper)
    archive = export_checkpoint_archive(checkpoint, scratch / "dump.tar")
    imported = import_checkpoint_archive(archive, scratch / "imported")

    assert json.loads((imported / "checkpoint.json").read_text()) == json.loads(
        (checkpoint / "checkpoint.json").read_text()
    )
    for name in ("pages-1.img", "inventory.img", "descriptors.json", "stats-dump"):
        assert (imported / "criu" / name).read_bytes() == (checkpoint / "criu" / name).read_bytes()

    restored = gnu_extract(imported / "layer.tar", scratch / "restored")
    original = describe(upper)
    assert describe(restored) == original
    whiteout = os.lstat(restored / "etc" / "deleted.conf")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)
    assert os.getxattr(restored / "workspace" / "cache", "trusted.overlay.opaque") == b"y"


@pytest.mark.timeout(60)
def test_podman_style_archive_imports_with_deleted_files(scratch: Path) -> None:
    """An archive without our metadata, deletions only in deleted.files, zstd-compressed as Podman's default."""
    diff_src = scratch / "diff"
    (diff_src / "app").mkdir(parents=True)
    (diff_src / "app" / "new.txt").write_text("new")
    layer = scratch / "rootfs-diff.tar"
    subprocess.run(["tar", "-cf", str(layer), "-C", str(diff_src), "app"], check=True)
    parts = scratch / "parts"
    (parts / "checkpoint").mkdir(parents=True)
    (parts / "checkpoint" / "pages-1.img").write_bytes(b"pages")
    (parts / "config.dump").write_text(
        json.dumps(
            {
                "id": "abc123",
                "name": "web",
                "rootfsImageRef": "sha256:" + "ef" * 32,
                "rootfsImageName": "quay.io/x/web:1",
                "runtime": "crun",
                "createdTime": "2026-04-01T00:00:00Z",
                "checkpointedTime": "2026-04-01T01:00:00Z",
                "restoredTime": "0001-01-01T00:00:00Z",
                "restored": False,
            }
        )
    )
    (parts / "spec.dump").write_text(json.dumps(OCI_SPEC))
    (parts / "deleted.files").write_text(json.dumps(["/etc/motd", "/var/log/old"]))
    os.rename(layer, parts / "rootfs-diff.tar")
    plain = scratch / "podman.tar"
    subprocess.run(["tar", "-cf", str(plain), "-C", str(parts), "."], check=True)
    subprocess.run(["zstd", "-q", str(plain), "-o", str(scratch / "podman.tar.zst")], check=True)

    imported = import_checkpoint_archive(scratch / "podman.tar.zst", scratch / "imported")
    checkpoint = json.loads((imported / "checkpoint.json").read_text())
    assert checkpoint["sandbox_id"] == "abc123" and checkpoint["oci_spec"] == OCI_SPEC
    assert checkpoint["image_digest"] == "sha256:" + "ef" * 32
    assert (imported / "criu" / "pages-1.img").read_bytes() == b"pages"
    restored = gnu_extract(imported / "layer.tar", scratch / "restored")
    assert (restored / "app" / "new.txt").read_text() == "new"
    for gone in ("etc/motd", "var/log/old"):
        st = os.lstat(restored / gone)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


@pytest.mark.timeout(60)
def test_snapshot_exports_straight_from_the_store(local_store: SnapshotStore, scratch: Path) -> None:
    upper = scratch / "upper"
    build_upper(upper)
    checkpoint = make_checkpoint(scratch / "ckpt", upper)
    local_store.put(checkpoint, make_meta("snap-1"))
    archive = local_store.export_archive("snap-1", scratch / "snap-1.tar")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files", "checkpoint/pages-1.img"} <= names
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".")] == []


@pytest.mark.timeout(30)
def test_unportable_overlay_features_are_refused(scratch: Path) -> None:
    upper = scratch / "upper"
    (upper / "moved").mkdir(parents=True)
    os.setxattr(upper / "moved", "trusted.overlay.redirect", b"/elsewhere")
    checkpoint = make_checkpoint(scratch / "ckpt", upper)
    with pytest.raises(InvalidCheckpoint, match="redirect"):
        export_checkpoint_archive(checkpoint, scratch / "dump.tar")
    assert not (scratch / "dump.tar").exists()
    assert [p.name for p in scratch.iterdir() if p.name.startswith(".")] == []


@pytest.mark.timeout(60)
def test_an_archive_member_read_into_memory_is_capped(scratch: Path) -> None:
    """A few kilobytes of zstd can hold a stats-dump of gigabytes: the importer reads no such member."""
    parts = scratch / "parts"
    (parts / "checkpoint").mkdir(parents=True)
    (parts / "checkpoint" / "pages-1.img").write_bytes(b"pages")
    (parts / "spec.dump").write_text(json.dumps(OCI_SPEC))
    with open(parts / "stats-dump", "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: zeros, which compress to almost nothing
    subprocess.run(["tar", "-cf", str(scratch / "big.tar"), "-C", str(parts), "."], check=True)
    subprocess.run(["zstd", "-q", str(scratch / "big.tar"), "-o", str(scratch / "big.tar.zst")], check=True)
    assert (scratch / "big.tar.zst").stat().st_size < 1 << 20
    with pytest.raises(InvalidCheckpoint, match="stats-dump holds 67108865 bytes; the limit is 67108864"):
        import_checkpoint_archive(scratch / "big.tar.zst", scratch / "imported")
    assert not (scratch / "imported").exists()
