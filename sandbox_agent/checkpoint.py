"""The checkpoint directory a node writes and any node restores from.

checkpoint.json   this module's metadata, with a size and sha256 for every other file
criu/             CRIU images
layer.tar         the writable overlay layer (see `overlay.export_layer`)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox_agent.errors import CheckpointCorrupt, NotFound
from sandbox_agent.spec import SandboxSpec

FORMAT = "stasis.checkpoint/v1"
METADATA = "checkpoint.json"
CRIU_DIR = "criu"
LAYER = "layer.tar"
_BLOCK = 1 << 20


@dataclass(frozen=True)
class Sizes:
    criu_bytes: int
    layer_bytes: int
    log_bytes: int = 0
    """The harness log's size at the freeze: where a restored run's output begins."""


@dataclass(frozen=True)
class CheckpointImage:
    """A checkpoint directory as one node wrote it: CRIU's images of a sandbox's processes, its
    writable layer, and this metadata about them (not the operation, nor the stored snapshot)."""

    sandbox_id: str
    node: str
    backend: str
    spec: SandboxSpec
    image_digest: str
    criu_version: str
    created_at: float
    leave_running: bool
    timings_ms: dict[str, float]
    """Milliseconds per phase (`phases.Phase`): freeze, dump, layer, frozen, total."""
    sizes: Sizes
    oci_spec: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    directory: Path = Path()

    @property
    def criu_dir(self) -> Path:
        return self.directory / CRIU_DIR

    @property
    def layer(self) -> Path:
        return self.directory / LAYER


def _timestamp(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else datetime.fromisoformat(value).timestamp()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _inventory(directory: Path, hash_files: bool) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_file() and rel != METADATA:
            entry: dict[str, Any] = {"size": path.stat().st_size}
            if hash_files:
                entry["sha256"] = file_digest(path)
            files[rel] = entry
    return files


def seal(checkpoint: CheckpointImage, *, hash_files: bool = True) -> CheckpointImage:
    """Record every file's size (and hash, unless a store hashes it anyway), then write the metadata last."""
    sealed = replace(checkpoint, files=_inventory(checkpoint.directory, hash_files))
    body = {"format": FORMAT, **_to_json(sealed)}
    tmp = checkpoint.directory / (METADATA + ".tmp")
    with open(tmp, "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(checkpoint.directory / METADATA)
    return sealed


def parse(raw: bytes, where: str, directory: Path = Path()) -> CheckpointImage:
    """The checkpoint that metadata `raw` (read from `where`) describes, its files in `directory`."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointCorrupt(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        found = body.get("format") if isinstance(body, dict) else None
        raise CheckpointCorrupt(f"{where} has format {found!r}; this node reads {FORMAT!r}")
    try:
        return CheckpointImage(
            sandbox_id=body["sandbox_id"],
            node=body["node"],
            backend=body["backend"],
            spec=SandboxSpec.from_json(body["spec"]),
            image_digest=body["image_digest"],
            criu_version=body["criu_version"],
            created_at=_timestamp(body["created_at"]),
            leave_running=body["leave_running"],
            timings_ms={str(k): float(v) for k, v in body.get("timings_ms", {}).items()},
            sizes=Sizes(**body["sizes"]),
            oci_spec=body["oci_spec"],
            files=_read_inventory(body.get("files", {})),
            directory=directory,
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CheckpointCorrupt(f"{where} lacks a field or has a wrong one: {exc}") from exc


def _read_inventory(files: object) -> dict[str, dict[str, Any]]:
    """A recorded file inventory: paths inside the checkpoint directory, each with its integer size."""
    if not isinstance(files, dict):
        raise TypeError("files is not an object")
    for rel, want in files.items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"files names {rel!r}, not a path inside the checkpoint")
        if not isinstance(want, dict) or type(want.get("size")) is not int:
            raise TypeError(f"files.{rel} has no integer size")
    return files


def load(directory: Path, *, verify: bool = True) -> CheckpointImage:
    """Read a checkpoint; with verify, refuse one whose files are missing, truncated or altered."""
    if not directory.is_dir():
        raise NotFound(f"checkpoint directory {directory} does not exist")
    meta = directory / METADATA
    try:
        raw = meta.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointCorrupt(f"{directory} is not a complete checkpoint: {METADATA} is missing") from exc
    checkpoint = parse(raw, str(meta), directory)
    for rel in (f"{CRIU_DIR}/inventory.img", LAYER):
        if not (directory / rel).is_file():
            raise CheckpointCorrupt(f"checkpoint {directory}: file {rel} is missing")
    if not checkpoint.files and verify:
        # An imported archive: its layer was rebuilt, so no inventory can vouch for the files.
        raise CheckpointCorrupt(
            f"{meta} has no file inventory to verify against; restore it without verification"
        )
    for rel, want in checkpoint.files.items():
        path = directory / rel
        if not path.is_file():
            raise CheckpointCorrupt(f"checkpoint {directory}: file {rel} is missing")
        size = path.stat().st_size
        if size != want["size"]:
            raise CheckpointCorrupt(
                f"checkpoint {directory}: file {rel} is {size} bytes, expected {want['size']}"
            )
        if verify and "sha256" not in want:
            raise CheckpointCorrupt(
                f"checkpoint {directory}: file {rel} has no recorded sha256 to verify against"
            )
        if verify and file_digest(path) != want["sha256"]:
            raise CheckpointCorrupt(f"checkpoint {directory}: file {rel} does not match its recorded sha256")
    return checkpoint


def _to_json(c: CheckpointImage) -> dict[str, Any]:
    d = {f: getattr(c, f) for f in c.__dataclass_fields__}
    d.pop("directory")
    d["spec"] = c.spec.to_json()
    # RFC 3339 and a `config` block: what the standard checkpoint archive's config.dump is made from.
    d["created_at"] = datetime.fromtimestamp(c.created_at, UTC).isoformat()
    d["config"] = {"name": c.sandbox_id, "image": c.spec.image, "oci_runtime": c.backend}
    d["sizes"] = asdict(c.sizes)
    return d
