"""A node's pull of a registry image beside `skopeo copy` plus `umoci unpack` of the same image.

    .venv/bin/python benchmarks/image_pull.py [--size-mb 500]

Builds an image of about SIZE MiB: the base image plus incompressible files in a layer of their
own. It pushes the image to a local registry (Debian's docker-registry on loopback), then times:

* baseline: `skopeo copy docker://… oci:…` plus `umoci unpack` into a fresh directory;
* Stasis, first node: `ImageCache.pull` into an empty cache. That is the same skopeo copy (every
  blob's digest verified), plus the layer checks, `umoci raw unpack`, the tree digest and the
  rename into the cache;
* Stasis, second pull with the layers already in the node's store: a v2 of the image that adds
  a small layer. Only that layer is fetched; the tree is unpacked again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.cli.local import LocalRegistry
from sandbox_agent.images.cache import ImageCache
from sandbox_agent.images.oci import RegistryAccess
from sandbox_agent.settings import DEFAULT_BASE_IMAGE_TAR


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def build(layout: Path, size_mb: int) -> None:
    """Tags v1 (base + SIZE MiB of random files, in one more layer) and v2 (v1 + 1 MiB)."""
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:v1")
    work = layout.parent / "bundle"
    _run("umoci", "unpack", "--image", f"{layout}:v1", str(work))
    _run("tar", "-xf", str(DEFAULT_BASE_IMAGE_TAR), "--numeric-owner", "-C", str(work / "rootfs"))
    _run("umoci", "repack", "--image", f"{layout}:v1", str(work))
    data = layout.parent / "data"
    base_mb = (
        sum(f.stat().st_size for f in (work / "rootfs").rglob("*") if f.is_file() and not f.is_symlink())
        >> 20
    )
    (data / "opt" / "weights").mkdir(parents=True)
    remaining = max(16, size_mb - base_mb)
    for i in range(0, remaining, 64):
        (data / "opt" / "weights" / f"shard-{i // 64:03d}.bin").write_bytes(
            os.urandom(min(64, remaining - i) << 20)
        )
    _run("umoci", "insert", "--image", f"{layout}:v1", str(data / "opt"), "/opt")
    _run("umoci", "tag", "--image", f"{layout}:v1", "v2")
    (data / "extra").mkdir()
    (data / "extra" / "patch.bin").write_bytes(os.urandom(1 << 20))
    _run("umoci", "insert", "--image", f"{layout}:v2", str(data / "extra"), "/opt/extra")
    _run("rm", "-rf", str(work), str(data))


def timed(fn: object) -> float:
    started = time.monotonic()
    fn()  # type: ignore[operator]
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size-mb", type=int, default=500)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="stasis-bench-pull-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        registry = LocalRegistry(root / "registry")
        registry.start()
        try:
            layout = root / "layout"
            build(layout, args.size_mb)
            refs = {}
            for tag in ("v1", "v2"):
                refs[tag] = f"{registry.host}/bench/harness:{tag}"
                _run(
                    "skopeo",
                    "copy",
                    "--dest-tls-verify=false",
                    f"oci:{layout}:{tag}",
                    f"docker://{refs[tag]}",
                )
            size = sum(f.stat().st_size for f in (layout / "blobs").rglob("*") if f.is_file())

            def baseline() -> None:
                out = root / "baseline"
                _run("skopeo", "copy", "--src-tls-verify=false", f"docker://{refs['v1']}", f"oci:{out}:v1")
                _run("umoci", "unpack", "--image", f"{out}:v1", str(root / "baseline-bundle"))

            base_s = timed(baseline)
            cache = ImageCache(root / "node-images")
            access = RegistryAccess()
            first_s = timed(lambda: cache.pull(refs["v1"], access))
            second_s = timed(lambda: cache.pull(refs["v2"], access))
        finally:
            registry.stop()
    mb = size / (1 << 20)
    print(f"image: {mb:.0f} MiB in the registry (base image + random files), pulled over loopback")
    print(f"{'':44}{'seconds':>10}{'MiB/s':>10}{'vs baseline':>13}")
    rows = (
        ("skopeo copy + umoci unpack (baseline)", base_s),
        ("Stasis pull, empty node", first_s),
        ("Stasis pull of v2, v1's layers in the store", second_s),
    )
    for label, seconds in rows:
        print(f"{label:44}{seconds:10.2f}{mb / seconds:10.0f}{seconds / base_s:12.2f}x")


if __name__ == "__main__":
    main()
