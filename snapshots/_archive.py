"""The standard container checkpoint archive (Podman, CRI-O, kubelet; read by checkpointctl).

Our checkpoint directory keeps the writable layer overlay-native (whiteouts
are 0:0 character devices, opaque directories carry trusted.overlay.opaque=y);
the archive's rootfs-diff.tar uses OCI layer whiteouts (.wh.<name>,
.wh..wh..opq). This module converts in both directions with tarfile, carrying
xattrs as SCHILY.xattr.* pax records, which GNU tar reads and writes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

import zstandard

from ._errors import InvalidCheckpoint
from ._manifest_json import rfc3339

# Member names fixed by go-criu's metadata package, which Podman, CRI-O and checkpointctl share.
CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
CHECKPOINT_DIRECTORY = "checkpoint"
ROOTFS_DIFF_TAR = "rootfs-diff.tar"
DELETED_FILES = "deleted.files"
STATS_DUMP = "stats-dump"
# Our own member: the agent's checkpoint.json verbatim, so import loses nothing. Other tools ignore it.
STASIS_CHECKPOINT = "stasis-checkpoint.json"

# Names inside our checkpoint directory.
CHECKPOINT_JSON = "checkpoint.json"
CRIU_DIRECTORY = "criu"
LAYER_TAR = "layer.tar"
MAX_SMALL_MEMBER = 64 << 20
"""The largest config.dump, spec.dump, deleted.files, stats-dump or Stasis metadata an import reads
into memory (each is kilobytes; a spec's files are at most 16 MiB)."""

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
XATTR = "SCHILY.xattr."
OVERLAY_XATTR = XATTR + "trusted.overlay."
OPAQUE_XATTR = OVERLAY_XATTR + "opaque"
# Overlay features whose meaning lives outside the upper layer and cannot survive a move.
_UNPORTABLE = ("redirect", "metacopy")
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _norm(name: str, where: str) -> str:
    """A member name as a clean relative path ('' for the root itself)."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", ".")]
    if ".." in parts:
        raise InvalidCheckpoint(where, f"member {name!r} escapes the layer root")
    return "/".join(parts)


def _copy_header(member: tarfile.TarInfo, name: str, xattrs: dict[str, str]) -> tarfile.TarInfo:
    """A fresh header for member under a new name, carrying only the given xattr records.

    Built from scratch because tarfile lets stale pax 'path'/'linkpath' records
    override a renamed member's name.
    """
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE if member.type == tarfile.GNUTYPE_SPARSE else member.type
    info.mode = member.mode
    info.uid, info.gid = member.uid, member.gid
    info.uname, info.gname = member.uname, member.gname
    info.mtime = member.mtime
    info.size = member.size if info.isreg() else 0
    info.devmajor, info.devminor = member.devmajor, member.devminor
    info.pax_headers = dict(xattrs)
    return info


def _marker(name: str, like: tarfile.TarInfo) -> tarfile.TarInfo:
    """An empty regular file owned like the given member (for OCI whiteouts)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE
    info.mode = like.mode & 0o7777
    info.uid, info.gid = like.uid, like.gid
    info.uname, info.gname = like.uname, like.gname
    info.mtime = like.mtime
    return info


def _whiteout_device(name: str, like: tarfile.TarInfo | None) -> tarfile.TarInfo:
    """An overlay whiteout: a 0:0 character device, mode 0 as overlayfs creates them."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor = info.devminor = 0
    info.mode = 0
    if like is not None:
        info.uid, info.gid = like.uid, like.gid
        info.uname, info.gname = like.uname, like.gname
        info.mtime = like.mtime
    else:
        info.mtime = int(time.time())
    return info


def _xattrs(member: tarfile.TarInfo) -> dict[str, str]:
    return {k: v for k, v in member.pax_headers.items() if k.startswith(XATTR)}


def _copy_member(
    tin: tarfile.TarFile, tout: tarfile.TarFile, member: tarfile.TarInfo, info: tarfile.TarInfo
) -> None:
    if member.isreg():
        tout.addfile(info, tin.extractfile(member))
    else:
        tout.addfile(info)


def overlay_to_oci(layer: Path, dest: Path) -> list[str]:
    """Convert an overlay-native layer tar to OCI whiteouts; returns deleted paths ('/a/b')."""
    deleted: list[str] = []
    where = str(layer)
    with tarfile.open(layer, "r|") as tin, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            name = _norm(member.name, where)
            if not name:
                continue  # The upper dir itself carries only node-local overlay xattrs.
            xattrs = _xattrs(member)
            for feature in _UNPORTABLE:
                if OVERLAY_XATTR + feature in xattrs:
                    raise InvalidCheckpoint(
                        where, f"{name} uses overlay {feature}, which cannot be moved off this node"
                    )
            portable = {k: v for k, v in xattrs.items() if not k.startswith(OVERLAY_XATTR)}
            if member.ischr() and member.devmajor == 0 and member.devminor == 0:
                parent, _, base = name.rpartition("/")
                tout.addfile(
                    _marker(f"{parent}/{WHITEOUT_PREFIX}{base}" if parent else WHITEOUT_PREFIX + base, member)
                )
                deleted.append("/" + name)
                continue
            info = _copy_header(member, name, portable)
            if member.islnk():
                info.linkname = _norm(member.linkname, where)
            elif member.issym():
                info.linkname = member.linkname
            _copy_member(tin, tout, member, info)
            if member.isdir() and xattrs.get(OPAQUE_XATTR) == "y":
                tout.addfile(_marker(f"{name}/{OPAQUE_MARKER}", member))
    return deleted


def oci_to_overlay(diff: Path, dest: Path, deleted_files: list[str]) -> None:
    """Convert an OCI-whiteout layer tar (plus Podman's deleted.files) to overlay-native form."""
    where = str(diff)
    opaque: set[str] = set()
    whiteouts: set[str] = set()
    with tarfile.open(diff, "r|") as tin:
        for member in tin:
            parent, _, base = _norm(member.name, where).rpartition("/")
            if base == OPAQUE_MARKER:
                opaque.add(parent)
            elif base.startswith(WHITEOUT_PREFIX):
                whiteouts.add(
                    f"{parent}/{base[len(WHITEOUT_PREFIX) :]}" if parent else base[len(WHITEOUT_PREFIX) :]
                )
    emitted_dirs: set[str] = set()
    with tarfile.open(diff, "r|") as tin, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            name = _norm(member.name, where)
            if not name:
                continue
            parent, _, base = name.rpartition("/")
            if base == OPAQUE_MARKER:
                if parent and parent not in emitted_dirs:
                    # The marker came before (or without) its directory's entry.
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, member.mtime
                    info.pax_headers = {OPAQUE_XATTR: "y"}
                    tout.addfile(info)
                    emitted_dirs.add(parent)
                continue
            if base.startswith(WHITEOUT_PREFIX):
                target = base[len(WHITEOUT_PREFIX) :]
                tout.addfile(_whiteout_device(f"{parent}/{target}" if parent else target, member))
                continue
            xattrs = {k: v for k, v in _xattrs(member).items() if not k.startswith(OVERLAY_XATTR)}
            if member.isdir() and name in opaque:
                xattrs[OPAQUE_XATTR] = "y"
                emitted_dirs.add(name)
            info = _copy_header(member, name, xattrs)
            if member.islnk():
                info.linkname = _norm(member.linkname, where)
            elif member.issym():
                info.linkname = member.linkname
            _copy_member(tin, tout, member, info)
        # Podman records deletions only in deleted.files; give each its overlay whiteout.
        for path in deleted_files:
            name = _norm(path, DELETED_FILES)
            if name and name not in whiteouts:
                tout.addfile(_whiteout_device(name, None))


def _read_checkpoint_json(directory: Path) -> dict[str, Any]:
    path = directory / CHECKPOINT_JSON
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InvalidCheckpoint(str(path), "missing") from None
    except (OSError, ValueError) as exc:
        raise InvalidCheckpoint(str(path), f"unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidCheckpoint(str(path), "not a JSON object")
    for key, kind in (("oci_spec", dict), ("sandbox_id", str), ("created_at", str)):
        if not isinstance(doc.get(key), kind):
            raise InvalidCheckpoint(str(path), f"field {key!r} missing or not a {kind.__name__}")
    return doc


def container_config(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """config.dump contents (go-criu's ContainerConfig, as Podman and CRI-O write it)."""
    raw_config = checkpoint.get("config")
    config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    digest = str(checkpoint.get("image_digest") or "")
    image_name = str(config.get("image") or config.get("image_name") or digest)
    checkpointed = _rfc3339_or(checkpoint["created_at"])
    return {
        "id": checkpoint["sandbox_id"],
        "name": str(config.get("name") or checkpoint["sandbox_id"]),
        "rootfsImage": image_name,
        "rootfsImageRef": digest,
        "rootfsImageName": image_name,
        # The docker backend runs runc underneath; CRIU images are runc's either way.
        "runtime": str(config.get("oci_runtime") or "runc"),
        "createdTime": _rfc3339_or(config.get("sandbox_created_at") or checkpoint["created_at"]),
        "checkpointedTime": checkpointed,
        "restoredTime": _GO_ZERO_TIME,
        "restored": False,
    }


def _rfc3339_or(value: object) -> str:
    """Normalise to the RFC 3339 form Go's time.Time parses; leave unparseable values as they are."""
    try:
        return rfc3339(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def _add_bytes(tout: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = 0o600  # What go-criu's WriteJSONFile uses.
    info.mtime = int(time.time())
    tout.addfile(info, io.BytesIO(content))


def _publish(temp: Path, dest: Path) -> None:
    with open(temp, "rb+") as f:
        os.fsync(f.fileno())
    os.rename(temp, dest)


def export_checkpoint_archive(checkpoint_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Write a checkpoint directory as a standard checkpoint archive (uncompressed tar) at dest.

    Members: config.dump, spec.dump, checkpoint/ (CRIU images), rootfs-diff.tar
    (OCI whiteouts, trusted.overlay.* dropped), deleted.files, stats-dump (when
    CRIU wrote one) and stasis-checkpoint.json. dest appears atomically.
    """
    source = Path(checkpoint_dir)
    target = Path(dest)
    checkpoint = _read_checkpoint_json(source)
    criu = source / CRIU_DIRECTORY
    if not criu.is_dir():
        raise InvalidCheckpoint(str(criu), "missing CRIU image directory")
    token = uuid.uuid4().hex
    temp = target.with_name(f".{target.name}.{token}.tmp")
    diff = target.with_name(f".{target.name}.{token}.rootfs-diff.tar")
    try:
        with tarfile.open(temp, "w", format=tarfile.PAX_FORMAT) as tout:
            _add_bytes(tout, CONFIG_DUMP, json.dumps(container_config(checkpoint), indent=2).encode())
            _add_bytes(tout, SPEC_DUMP, json.dumps(checkpoint["oci_spec"], indent=2).encode())
            _add_bytes(tout, STASIS_CHECKPOINT, (source / CHECKPOINT_JSON).read_bytes())
            tout.add(criu, arcname=CHECKPOINT_DIRECTORY, recursive=True)
            layer = source / LAYER_TAR
            deleted: list[str] = []
            if layer.is_file():
                deleted = overlay_to_oci(layer, diff)
                tout.add(diff, arcname=ROOTFS_DIFF_TAR)
            _add_bytes(tout, DELETED_FILES, json.dumps(deleted, indent=2).encode())
            if (criu / STATS_DUMP).is_file():
                tout.add(criu / STATS_DUMP, arcname=STATS_DUMP)
        _publish(temp, target)
    except tarfile.TarError as exc:
        raise InvalidCheckpoint(str(source / LAYER_TAR), f"not a readable tar: {exc}") from None
    finally:
        temp.unlink(missing_ok=True)
        diff.unlink(missing_ok=True)
    return target


def _open_archive(path: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Stream members of a plain, gzip or zstd compressed (Podman's default) archive."""
    with open(path, "rb") as raw:
        magic = raw.read(4)
        raw.seek(0)
        stream: IO[bytes] = raw
        if magic == _ZSTD_MAGIC:
            stream = zstandard.ZstdDecompressor().stream_reader(raw)
        with tarfile.open(fileobj=stream, mode="r|*") as tin:
            for member in tin:
                yield tin, member


def import_checkpoint_archive(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Unpack a standard checkpoint archive into a new checkpoint directory at dest.

    rootfs-diff.tar becomes an overlay-native layer.tar (OCI whiteouts and
    deleted.files become 0:0 devices, .wh..wh..opq becomes trusted.overlay.opaque=y).
    checkpoint.json is restored verbatim from stasis-checkpoint.json, or
    synthesised from config.dump and spec.dump for archives of other tools.
    dest must not exist and appears complete or not at all.
    """
    source = Path(archive)
    target = Path(dest)
    if target.exists():
        raise FileExistsError(f"import destination {target} already exists")
    work = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex}")
    criu = work / CRIU_DIRECTORY
    criu.mkdir(parents=True, mode=0o700)
    small: dict[str, bytes] = {}
    try:
        seen: set[str] = set()
        for tin, member in _open_archive(source):
            name = _norm(member.name, str(source))
            if name in seen and not member.isdir():
                raise InvalidCheckpoint(str(source), f"{name} is in the archive twice")
            seen.add(name)
            head, _, rest = name.partition("/")
            if head == CHECKPOINT_DIRECTORY and rest:
                path = criu / rest
                try:
                    if member.isdir():
                        path.mkdir(parents=True, exist_ok=True)
                    elif member.isreg():
                        path.parent.mkdir(parents=True, exist_ok=True)
                        with tin.extractfile(member) as src, open(path, "wb") as out:  # type: ignore[union-attr]
                            shutil.copyfileobj(src, out, 1 << 20)
                        os.chmod(path, member.mode & 0o7777)
                    else:
                        raise InvalidCheckpoint(
                            str(source), f"{name}: only files and directories belong in checkpoint/"
                        )
                except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:
                    raise InvalidCheckpoint(str(source), f"{name}: {exc.strerror} in checkpoint/") from None
            elif name == ROOTFS_DIFF_TAR and member.isreg():
                with tin.extractfile(member) as src, open(work / ROOTFS_DIFF_TAR, "wb") as out:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, out, 1 << 20)
            elif (
                name in (CONFIG_DUMP, SPEC_DUMP, DELETED_FILES, STATS_DUMP, STASIS_CHECKPOINT)
                and member.isreg()
            ):
                if member.size > MAX_SMALL_MEMBER:
                    raise InvalidCheckpoint(
                        str(source), f"{name} holds {member.size} bytes; the limit is {MAX_SMALL_MEMBER}"
                    )
                extracted = tin.extractfile(member)
                assert extracted is not None
                small[name] = extracted.read(MAX_SMALL_MEMBER + 1)
        deleted = _json_member(small, DELETED_FILES, source, default=[])
        if not isinstance(deleted, list) or not all(isinstance(p, str) for p in deleted):
            raise InvalidCheckpoint(str(source), f"{DELETED_FILES} is not a JSON list of paths")
        diff = work / ROOTFS_DIFF_TAR
        if diff.exists():
            oci_to_overlay(diff, work / LAYER_TAR, deleted)
            diff.unlink()
        elif deleted:
            empty = work / ".empty.tar"
            with tarfile.open(empty, "w", format=tarfile.PAX_FORMAT):
                pass
            oci_to_overlay(empty, work / LAYER_TAR, deleted)
            empty.unlink()
        if STATS_DUMP in small and not (criu / STATS_DUMP).exists():
            (criu / STATS_DUMP).write_bytes(small[STATS_DUMP])
        if STASIS_CHECKPOINT in small:
            # The agent's file inventory described the files it wrote; layer.tar was rebuilt from
            # rootfs-diff.tar, so the inventory no longer holds and is dropped.
            original = _json_member(small, STASIS_CHECKPOINT, source)
            if not isinstance(original, dict):
                raise InvalidCheckpoint(str(source), f"{STASIS_CHECKPOINT} is not a JSON object")
            original.pop("files", None)
            checkpoint_json = json.dumps(original, indent=1).encode()
        else:
            checkpoint_json = json.dumps(_synthesise_checkpoint(small, source), indent=2).encode()
        (work / CHECKPOINT_JSON).write_bytes(checkpoint_json)
        os.rename(work, target)
    except (tarfile.TarError, zstandard.ZstdError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise InvalidCheckpoint(str(source), f"not a readable checkpoint archive: {exc}") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def _json_member(small: dict[str, bytes], name: str, source: Path, default: Any = None) -> Any:
    if name not in small:
        if default is None:
            raise InvalidCheckpoint(str(source), f"archive has no {name}")
        return default
    try:
        return json.loads(small[name])
    except ValueError as exc:
        raise InvalidCheckpoint(str(source), f"{name} is not JSON: {exc}") from None


def _synthesise_checkpoint(small: dict[str, bytes], source: Path) -> dict[str, Any]:
    """checkpoint.json for an archive written by Podman, CRI-O or kubelet."""
    config = _json_member(small, CONFIG_DUMP, source)
    spec = _json_member(small, SPEC_DUMP, source)
    if not isinstance(config, dict) or not isinstance(spec, dict):
        raise InvalidCheckpoint(str(source), f"{CONFIG_DUMP} and {SPEC_DUMP} must be JSON objects")
    return {
        "sandbox_id": str(config.get("id", "")),
        "oci_spec": spec,
        "image_digest": str(config.get("rootfsImageRef", "")),
        "backend": "runc",
        "criu_version": "",
        "created_at": str(config.get("checkpointedTime", "")),
        "config": {
            "name": config.get("name"),
            "image": config.get("rootfsImageName"),
            "oci_runtime": config.get("runtime"),
            "sandbox_created_at": config.get("createdTime"),
        },
        "imported_from": "checkpoint-archive",
    }
