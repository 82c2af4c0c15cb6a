"""OCI images for the tests, built with umoci from the base image: an image config with its
ENV, WORKDIR, non-root USER and CMD, and hand-made layers a node must refuse."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from sandbox_agent.settings import DEFAULT_BASE_IMAGE_TAR


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def harness_image(layout: Path, tag: str, files: dict[str, str], *, user: str = "agent") -> None:
    """The base image plus `files` and a user `agent` (uid 1000), with a config a harness author
    would write: ENV, WORKDIR /home/agent/work, USER, CMD."""
    work = layout.parent / f"{tag}-bundle"
    if not (layout / "index.json").exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    _run("umoci", "unpack", "--image", f"{layout}:{tag}", str(work))
    rootfs = work / "rootfs"
    _run("tar", "-xf", str(DEFAULT_BASE_IMAGE_TAR), "--numeric-owner", "-C", str(rootfs))
    with open(rootfs / "etc" / "passwd", "a") as f:
        f.write("agent:x:1000:1000:agent:/home/agent:/bin/sh\n")
    with open(rootfs / "etc" / "group", "a") as f:
        f.write("agent:x:1000:\n")
    home = rootfs / "home" / "agent" / "work"
    home.mkdir(parents=True)
    for path, text in files.items():
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)
    _run("chown", "-R", "1000:1000", str(rootfs / "home" / "agent"))
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(work))
    _run(
        "umoci", "config", "--image", f"{layout}:{tag}",
        "--config.env", "HARNESS_MODE=image", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
        "--config.workingdir", "/home/agent/work", "--config.user", user,
        "--config.cmd", "/bin/sh", "--config.cmd", "/usr/local/bin/harness.sh",
    )  # fmt: skip
    _run("rm", "-rf", str(work))


def with_layer(layout: Path, tag: str, new_tag: str, members: list[tarfile.TarInfo]) -> None:
    """Tag `new_tag` as `tag` plus one more layer made of `members` (empty files, links, devices)."""
    layer = layout.parent / f"{new_tag}.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"") if member.isfile() else None)
    layer.write_bytes(buf.getvalue())
    _run("umoci", "tag", "--image", f"{layout}:{tag}", new_tag)
    _run("umoci", "raw", "add-layer", "--image", f"{layout}:{new_tag}", str(layer))


def member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", device: tuple[int, int] = (0, 0)
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.devmajor, info.devminor = device
    info.mode = 0o644
    return info
