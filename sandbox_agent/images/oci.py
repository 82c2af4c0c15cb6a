"""OCI images from registries and archives, the way a node gets them: fetched with skopeo into
the node's OCI layout (every blob's digest verified, blobs the node already has never fetched
again), checked entry by entry, and unpacked with umoci, whiteouts included, into the image cache.

Sources:

    host[:port]/repo:tag, host[:port]/repo@sha256:...   a registry (docker://)
    docker-archive:/path.tar, oci-archive:/path.tar     an archive on the node
    oci:/path/layout[:tag]                              an OCI layout directory on the node
    docker-daemon:image:tag                             the node's Docker engine

A registry on a loopback address may speak plain HTTP; any other needs TLS unless the node lists
it as insecure. Credentials come from a docker `config.json` and are passed to skopeo by path,
never on a command line, in a log or to a sandbox.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import os
import re
import tarfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from protos.shared.address import host_of
from sandbox_agent.errors import CommandFailed, ImageRejected, InvalidSpec
from sandbox_agent.host import tools

_REFERENCE = re.compile(
    r"^(?P<host>[a-zA-Z0-9.-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/"
    r"(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
TRANSPORTS = ("docker-archive:", "oci-archive:", "oci:", "docker-daemon:")
MAX_CONFIG_BYTES = 4 << 20
"""An image's manifest or config blob is a few KiB; more is not an image to trust."""


@dataclass(frozen=True)
class Reference:
    """A registry image reference: host, repository, and a tag and/or a manifest digest."""

    host: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str) -> Reference | None:
        """A registry reference, or None if `text` is not one (a cached name, a digest, a path)."""
        m = _REFERENCE.match(text)
        if m is None or not ("." in m["host"] or ":" in m["host"] or m["host"] == "localhost"):
            return None
        return cls(m["host"], m["repo"], m["tag"] or "", m["digest"] or "")

    def __str__(self) -> str:
        return (
            f"{self.host}/{self.repository}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )

    def pinned(self, digest: str) -> str:
        """This image by manifest digest: the same bytes for every node and every restore."""
        return f"{self.host}/{self.repository}@{digest}"

    @property
    def loopback(self) -> bool:
        try:
            host = host_of(self.host, "registry")
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def is_pullable(ref: str) -> bool:
    """Whether a node can fetch this image itself (as opposed to a name or digest it must have)."""
    return Reference.parse(ref) is not None or ref.startswith(TRANSPORTS)


@dataclass(frozen=True)
class RegistryAccess:
    """How this node reaches registries; built from the agent's settings."""

    auth_file: Path | None = None
    """A docker config.json with the registries' credentials."""
    certs_dir: Path | None = None
    """CA certificates for registries with private CAs, as <certs_dir>/<host[:port]>/ca.crt."""
    insecure: tuple[str, ...] = ()
    """Registries (host[:port]) reached over plain HTTP beside those on loopback addresses."""
    docker_host: str = "unix:///var/run/docker.sock"
    """The Docker engine that docker-daemon: sources read from."""


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config says about how to run it (docker run's rules apply)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """KEY=VALUE, in the image's order."""
    working_dir: str = ""
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, config: dict[str, Any]) -> ImageConfig:
        """Read what an image's config blob says; fields of the wrong type count as unset."""
        c = config.get("config") if isinstance(config, dict) else None
        c = c if isinstance(c, dict) else {}

        def strings(key: str) -> tuple[str, ...]:
            value = c.get(key)
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            return tuple(value) if ok else ()  # type: ignore[arg-type]

        def string(key: str) -> str:
            value = c.get(key)
            return value if isinstance(value, str) else ""

        labels = c.get("Labels")
        return cls(
            entrypoint=strings("Entrypoint"), cmd=strings("Cmd"), env=strings("Env"),
            working_dir=string("WorkingDir"), user=string("User"),
            labels={k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(labels, dict) else {},
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"entrypoint": list(self.entrypoint), "cmd": list(self.cmd), "env": list(self.env),
                "working_dir": self.working_dir, "user": self.user, "labels": self.labels}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImageConfig:
        return cls(tuple(d.get("entrypoint", ())), tuple(d.get("cmd", ())), tuple(d.get("env", ())),
                   d.get("working_dir", ""), d.get("user", ""), dict(d.get("labels", {})))  # fmt: skip


def _source(ref: str) -> tuple[str, Reference | None]:
    if ref.startswith(TRANSPORTS):
        return ref, None
    parsed = Reference.parse(ref)
    if parsed is None:
        raise InvalidSpec(
            "image", f"{ref!r} is not a registry reference (host[:port]/repo:tag or @sha256:...)"
        )
    return f"docker://{parsed}", parsed


def _flags(parsed: Reference | None, access: RegistryAccess, prefix: str) -> list[str]:
    """skopeo's options for reaching a source; `prefix` is --src- for copy, -- for inspect."""
    if parsed is None:
        return [f"{prefix}daemon-host", access.docker_host]
    secure = not (parsed.loopback or parsed.host in access.insecure)
    flags = [f"{prefix}tls-verify={'true' if secure else 'false'}"]
    if access.auth_file is not None and access.auth_file.is_file():
        flags += [f"{prefix}authfile", str(access.auth_file)]
    if access.certs_dir is not None and (access.certs_dir / parsed.host).is_dir():
        flags += [f"{prefix}cert-dir", str(access.certs_dir / parsed.host)]
    return flags


def _refused(ref: str, exc: CommandFailed) -> ImageRejected:
    detail = exc.stderr_tail.strip().splitlines()[-1:] or [f"skopeo exited {exc.returncode}"]
    return ImageRejected(f"image {ref!r}: {detail[0][:600]}")


def resolve(ref: str, access: RegistryAccess) -> str:
    """The manifest digest a registry reference names now: a tag resolved once, for good."""
    source, parsed = _source(ref)
    if parsed is None:
        raise InvalidSpec("image", f"{ref!r} is not a registry reference")
    if parsed.digest:
        return parsed.digest
    argv = ["skopeo", "inspect", "--format", "{{.Digest}}", *_flags(parsed, access, "--")]
    try:
        out = tools.run([*argv, source], what=f"resolving image {ref}", timeout=120).stdout.decode().strip()
    except CommandFailed as exc:
        raise _refused(ref, exc) from None
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", out):
        raise ImageRejected(f"image {ref!r}: the registry gave no manifest digest ({out[:100]!r})")
    return out


@dataclass(frozen=True)
class PullProgress:
    """Where one pull is: `waiting` for the cache, `fetching` (bytes of the image's blobs on the
    node, those it already held included; `bytes_total` is 0 when unknown), then `unpacking`."""

    phase: str
    bytes_done: int = 0
    bytes_total: int = 0


Progress = Callable[[PullProgress], None]

PROGRESS_INTERVAL_S = 0.5


def _blob_sizes(source: str, parsed: Reference | None, access: RegistryAccess) -> dict[str, int]:
    """The manifest's config and layer sizes by digest; empty when the reference names an index
    or the manifest cannot be read (the copy then reports the registry's error)."""
    argv = ["skopeo", "inspect", "--raw", *_flags(parsed, access, "--"), source]
    try:
        manifest = json.loads(tools.run(argv, what="reading a manifest", timeout=120).stdout)
        blobs = [manifest["config"], *manifest["layers"]]
        return {str(b["digest"]): int(b["size"]) for b in blobs}
    except (CommandFailed, ValueError, KeyError, TypeError):
        return {}


@contextmanager
def _watched(layout: Path, sizes: dict[str, int], progress: Progress) -> Iterator[None]:
    """Report the bytes skopeo has written into the layout every PROGRESS_INTERVAL_S: blobs it
    already held count as done, new files (its `oci-put-blob*` temporaries, then the renamed
    blobs) by their size so far."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def files() -> list[os.DirEntry[str]]:
        """The layout's own files (skopeo's temporaries among them) and its blobs."""
        return [e for d in (layout, blobs) for e in os.scandir(d) if e.is_file(follow_symlinks=False)]

    held = sum(size for digest, size in sizes.items() if _present(layout, digest))
    before = {e.path for e in files()}
    total = sum(sizes.values())
    stop = threading.Event()

    def written() -> int:
        fresh = 0
        for e in files():
            try:
                if e.path not in before and e.name != "index.json":
                    fresh += e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass  # a temporary renamed under our feet
        return fresh

    def report() -> None:
        while not stop.wait(PROGRESS_INTERVAL_S):
            progress(PullProgress("fetching", min(held + written(), total or 1 << 62), total))

    progress(PullProgress("fetching", held, total))
    watcher = threading.Thread(target=report, name="pull-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    progress(PullProgress("fetching", total or held + written(), total))


def _present(layout: Path, digest: str) -> bool:
    try:
        return _blob(layout, digest).is_file()
    except ImageRejected:
        return False


@dataclass(frozen=True)
class Fetched:
    """An image in the node's OCI layout, under a tag of its own, checked and ready to unpack."""

    layout: Path
    tag: str
    config: ImageConfig
    layers: tuple[str, ...]
    size_bytes: int


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
        raise ImageRejected(f"blob digest {digest!r} is not a sha256 digest")
    return layout / "blobs" / "sha256" / hexdigest


def _json_blob(layout: Path, digest: str, ref: str) -> dict[str, Any]:
    path = _blob(layout, digest)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ImageRejected(
            f"image {ref!r}: blob {digest} is {path.stat().st_size} bytes, not an image's metadata"
        )
    data: dict[str, Any] = json.loads(path.read_bytes())
    return data


def fetch(ref: str, layout: Path, access: RegistryAccess, progress: Progress | None = None) -> Fetched:
    """Copy an image into the layout (skopeo checks every blob against its digest) and check its
    layers. The caller unpacks it and then `forget`s the tag."""
    source, parsed = _source(ref)
    tag = f"pull-{uuid.uuid4().hex[:12]}"
    watch = (
        _watched(layout, _blob_sizes(source, parsed, access), progress)
        if progress is not None
        else nullcontext()
    )
    try:
        with watch:
            tools.run(
                [
                    "skopeo",
                    "copy",
                    "--quiet",
                    *_flags(parsed, access, "--src-"),
                    source,
                    f"oci:{layout}:{tag}",
                ],
                what=f"pulling image {ref}",
                timeout=3600,
            )
    except CommandFailed as exc:
        raise _refused(ref, exc) from None
    index = json.loads((layout / "index.json").read_text())
    entry = next(
        m
        for m in index["manifests"]
        if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag
    )
    manifest = _json_blob(layout, entry["digest"], ref)
    config = ImageConfig.from_oci(_json_blob(layout, manifest["config"]["digest"], ref))
    layers = tuple(str(layer["digest"]) for layer in manifest.get("layers") or [])
    for layer, media_type in zip(
        layers, (str(x.get("mediaType", "")) for x in manifest["layers"]), strict=True
    ):
        check_layer(_blob(layout, layer), media_type, f"image {ref!r}, layer {layer}")
    size = sum(int(x.get("size", 0)) for x in manifest.get("layers") or [])
    return Fetched(layout, tag, config, layers, size)


def unpack(fetched: Fetched, rootfs: Path) -> None:
    """Unpack a fetched image's layers in order, whiteouts applied, ownership kept."""
    tools.run(
        ["umoci", "raw", "unpack", "--image", f"{fetched.layout}:{fetched.tag}", str(rootfs)],
        what=f"unpacking image layers into {rootfs}",
        timeout=3600,
    )


def forget(fetched: Fetched) -> None:
    """Drop the layout's tag for a pull; its blobs stay, so the next pull of a layer is free."""
    tools.run(
        ["umoci", "rm", "--image", f"{fetched.layout}:{fetched.tag}"], check=False, what="untagging a pull"
    )


@contextmanager
def _layer_stream(path: Path, media_type: str) -> Iterator[Any]:
    with open(path, "rb") as raw:
        head = raw.read(4)
        raw.seek(0)
        if head[:2] == b"\x1f\x8b" or media_type.endswith("gzip"):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream
        elif head == b"\x28\xb5\x2f\xfd" or media_type.endswith("zstd"):
            with zstandard.ZstdDecompressor().stream_reader(raw) as stream:
                yield stream
        else:
            yield raw


def check_layer(path: Path, media_type: str, what: str) -> None:
    """Refuse a layer that would write outside the root or create what a sandbox must not have:
    `..` in a path, a link that resolves above the root, device nodes."""
    try:
        with _layer_stream(path, media_type) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                _check_member(member, what)
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as exc:
        raise ImageRejected(f"{what}: not a readable layer archive: {exc}") from None


def _stays_inside(parts: list[str]) -> bool:
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        if depth < 0:
            return False
    return True


def _check_member(member: tarfile.TarInfo, what: str) -> None:
    parts = member.name.split("/")
    if ".." in parts:
        raise ImageRejected(f"{what}: entry {member.name!r} has a '..' path component")
    if member.isdev():
        raise ImageRejected(
            f"{what}: entry {member.name!r} is a device node; images may not carry device nodes"
        )
    # An absolute symlink resolves inside the sandbox's root; a relative one must not climb out.
    escapes = not _stays_inside(parts[:-1] + member.linkname.split("/"))
    if member.issym() and not member.linkname.startswith("/") and escapes:
        raise ImageRejected(f"{what}: symlink {member.name!r} -> {member.linkname!r} escapes the image root")
    if member.islnk() and ".." in member.linkname.split("/"):
        raise ImageRejected(
            f"{what}: hard link {member.name!r} -> {member.linkname!r} escapes the image root"
        )
