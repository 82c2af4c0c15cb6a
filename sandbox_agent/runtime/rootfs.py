"""A runc sandbox's root filesystem: its writable layer on a disk of its own, over its image,
as the sandbox's own ids see them (`idmap`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandbox_agent.errors import FailedPrecondition, InvalidSpec
from sandbox_agent.host import confined, idmap, network, overlay
from sandbox_agent.host.layer_disks import LayerDisks
from sandbox_agent.images.cache import Image
from sandbox_agent.runtime.backend import STATE_DIR, LayerFile, SandboxLayout
from sandbox_agent.spec import Resources, SandboxRecord


class RootFs:
    """The node's layer disks and id maps, and the mounts a sandbox's root is made of."""

    def __init__(self, host_key: str, disks: LayerDisks) -> None:
        self.host_key = host_key
        """The node's `AgentSettings.host_key`: it names the sandboxes' netns (their sysfs)."""
        self.disks = disks
        """Spare layer filesystems, in a dir on the filesystem of the sandboxes' dirs."""
        self._idmaps: dict[int, idmap.IdMap] = {}
        self._idmaps_lock = threading.Lock()

    def idmap(self, userns_base: int) -> idmap.IdMap | None:
        """The node's id map for sandboxes whose ids start at that host id; None for no user namespace."""
        if not userns_base:
            return None
        with self._idmaps_lock:
            if userns_base not in self._idmaps:
                self._idmaps[userns_base] = idmap.IdMap(userns_base)
            return self._idmaps[userns_base]

    def build(
        self, record: SandboxRecord, layout: SandboxLayout, image: Image, files: dict[str, bytes]
    ) -> None:
        """A fresh sandbox's root: its layer's disk, the spec's files in it, and the mounts."""
        self.layer_disk(record, layout)
        _prepare_layer(record, layout, image, files)
        self.mount(record, layout, image)

    def layer_disk(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        if overlay.is_mounted(layout.layer):
            return
        res = record.spec.resources
        self.disks.place(layout.layer_image, (res.disk_mb, res.inodes))
        overlay.mount_layer_disk(layout.layer_image, layout.layer)

    def mount(self, record: SandboxRecord, layout: SandboxLayout, image: Image) -> None:
        """The sandbox's root: its layer over its image, as its own ids see them."""
        ids = self.idmap(record.spec.userns_base)
        if ids is None:
            overlay.mount([image.rootfs], layout.upper, layout.work, layout.rootfs)
            return
        for d in (layout.upper, layout.work):
            d.mkdir(exist_ok=True)
        image_view, layer_view = layout.mapped / "image", layout.mapped / "layer"
        ids.mount_view(image.rootfs, image_view)
        ids.mount_view(layout.layer, layer_view)
        ids.mount_overlay([image_view], layer_view / "upper", layer_view / "work", layout.rootfs)
        layout.sysfs.mkdir(parents=True, exist_ok=True)
        network.mount_sysfs(self.host_key, record.id, layout.sysfs)

    def place(
        self, record: SandboxRecord, layout: SandboxLayout, image: Image, files: tuple[LayerFile, ...]
    ) -> None:
        """Write `files` into a restored sandbox's layer, before its root is mounted. The layer is
        the harness's: whatever it left at a file's path is replaced, never followed, and a
        directory on the way that is not one (a symlink at /.stasis) refuses the restore."""
        with _as_the_node_sees_it(layout, image) as staging:
            for file in files:
                owner = record.spec.ids if file.harness_owned else (0, 0)
                try:
                    confined.write(staging, file.path.lstrip("/"), file.content, file.mode, owner)
                except confined.Escapes as exc:
                    raise FailedPrecondition(
                        f"sandbox {record.id}: {file.path} cannot be written into the restored layer: {exc}"
                    ) from None

    def mount_graded(self, layout: SandboxLayout, image: Image, userns_base: int) -> Path:
        """Mount an exited sandbox's final tree, read-only, as a verifier with those ids sees it."""
        lowers = [layout.upper, image.rootfs]
        ids = self.idmap(userns_base)
        if ids is not None:
            layer_view, image_view = layout.mapped / "graded-layer", layout.mapped / "graded-image"
            ids.mount_view(layout.layer, layer_view)
            ids.mount_view(image.rootfs, image_view)
            lowers = [layer_view / "upper", image_view]
        overlay.mount_read_only(lowers, layout.graded)
        return layout.graded

    def warm(self, userns_base: int) -> None:
        default = Resources()
        self.disks.warm((default.disk_mb, default.inodes))
        ids = self.idmap(userns_base)
        if ids is not None:
            # Its user namespace takes a process and 3-5 ms: not on the way of the first restore.
            threading.Thread(target=ids.warm, name="idmap", daemon=True).start()

    def close(self) -> None:
        self.disks.close()


def _prepare_layer(
    record: SandboxRecord, layout: SandboxLayout, image: Image, files: dict[str, bytes]
) -> None:
    """Write the state folder and the spec's files into the layer."""
    with _as_the_node_sees_it(layout, image) as staging:
        # The harness writes its log and exit code there as its own user. The image may hold
        # anything at /.stasis (a symlink to a node directory): it is reached without
        # following one, and chowned through its descriptor.
        try:
            with confined.directory(staging, STATE_DIR.strip("/").split("/"), make=True) as fd:
                os.fchown(fd, *record.spec.ids)
        except confined.Escapes as exc:
            raise InvalidSpec("image", f"{record.spec.image}: {exc}; Stasis keeps its state there") from None
        overlay.place_files(staging, files)


@contextmanager
def _as_the_node_sees_it(layout: SandboxLayout, image: Image) -> Iterator[Path]:
    """The layer over its image as the node sees its tree, which is how it lies on disk: the
    node writes there as the sandbox's own ids (a sandbox's id-mapped view refuses the node's
    root as owner)."""
    staging = layout.dir / "prepare"
    overlay.mount([image.rootfs], layout.upper, layout.work, staging)
    try:
        yield staging
    finally:
        overlay.unmount(staging)
