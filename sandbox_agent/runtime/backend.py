"""The interface every sandbox runtime backend (runc, Docker) implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandbox_agent.checkpoint import CheckpointImage
from sandbox_agent.criu.lazy import Transfer
from sandbox_agent.images.cache import Image
from sandbox_agent.spec import SandboxRecord, SandboxState

STATE_DIR = "/.stasis"
"""In-sandbox folder for the harness log and exit code; it is in the writable layer, so it travels."""
HARNESS_LOG = f"{STATE_DIR}/harness.log"
EXIT_CODE = f"{STATE_DIR}/exit-code"
GRADED_MOUNT = "/episode"
"""Where a verifier sees the graded episode's final filesystem."""
STOP_TIMEOUT_S = 30.0
"""How long a killed sandbox's processes may take to exit before stopping it counts as failed."""

# CRIU cannot dump a descriptor of a host file, so the harness's stdio must point at files
# inside the sandbox; the shell stays as PID 1 to record the harness's exit code.
_WRAPPER = f'exec </dev/null >>{HARNESS_LOG} 2>&1; "$0" "$@"; echo $? >{EXIT_CODE}'


def wrapped_command(argv: tuple[str, ...]) -> list[str]:
    return ["/bin/sh", "-c", _WRAPPER, *argv]


@dataclass(frozen=True)
class LayerFile:
    """A file the node writes into a restored sandbox's writable layer before its processes
    resume. Whatever the layer holds at `path` (a symlink the harness planted, say) is replaced,
    never followed."""

    path: str
    """Absolute, in the sandbox."""
    content: bytes
    mode: int = 0o644
    harness_owned: bool = False
    """Owned by the sandbox's user (the spec's ids, like `STATE_DIR`); else by its root."""


@dataclass(frozen=True)
class SandboxLayout:
    """Node-local paths of one sandbox; nothing here is assumed to exist on another node."""

    dir: Path
    reachable: Path
    """What the sandbox's own user resolves when runc builds its mounts (its root filesystem and
    the sources of its bind mounts): a place its unprivileged host ids can reach, whatever the
    permissions of the agent's root (see `AgentSettings.run_dir`)."""

    @property
    def layer(self) -> Path:
        """The writable layer's own filesystem (runc): `upper` and `work` live on it."""
        return self.dir / "layer"

    @property
    def layer_image(self) -> Path:
        """The sparse file that filesystem is made in."""
        return self.dir / "layer.img"

    @property
    def graded(self) -> Path:
        """Where a verifier of this (exited) sandbox reads its final tree from."""
        return self.reachable / "graded"

    @property
    def sysfs(self) -> Path:
        """A sysfs of the sandbox's own netns, which a sandbox in a user namespace cannot mount."""
        return self.reachable / "sys"

    @property
    def mapped(self) -> Path:
        """Id-mapped mounts of its image and layer, which its overlay root is made of (`idmap`)."""
        return self.dir / "mapped"

    @property
    def upper(self) -> Path:
        return self.layer / "upper"

    @property
    def work(self) -> Path:
        return self.layer / "work"

    @property
    def bundle(self) -> Path:
        return self.dir / "bundle"

    @property
    def rootfs(self) -> Path:
        return self.reachable / "rootfs"

    @property
    def criu_work(self) -> Path:
        return self.dir / "criu-work"

    @property
    def record(self) -> Path:
        return self.dir / "sandbox.json"

    @property
    def arriving(self) -> Path:
        """Present while a lazy restore's memory is still arriving (see `lazy`): an agent that
        finds it at start-up died mid-transfer, and the sandbox cannot be trusted."""
        return self.dir / "memory-arriving"

    @property
    def stopped(self) -> Path:
        """Present while a stopping checkpoint holds the sandbox's processes only in images: it
        names their directory, so an agent that restarts before the commit can revive them."""
        return self.dir / "stopped-at-dump"


class Checkpoints(Protocol):
    """A runtime's dumps and restores of its sandboxes' processes."""

    lazy_restore: bool
    """Whether `restore` takes a `lazy.Transfer`, to resume before the memory is all here."""
    restore_timeout_s: float
    """How long a restore may take before it is killed and fails."""
    places_files: bool
    """Whether `restore` writes `files` into the writable layer (a fork child's)."""

    def dump(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        """CRIU-dump the frozen sandbox into images_dir and leave it frozen."""

    def dump_and_stop(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> float | None:
        """Freeze the running sandbox, CRIU-dump it into images_dir and kill it, so that none of
        its code runs after the dump; return once its processes are gone and their memory is
        free. If this fails, the sandbox runs on, as it was. Returns how long its tasks were
        frozen, in ms, where CRIU froze them itself (only it knows); None if the call was frozen
        throughout."""

    def prepare_restore(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        """What a restore needs before the checkpoint's files are here; it runs while they are
        fetched."""

    def restore(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        checkpoint: CheckpointImage,
        transfer: Transfer | None = None,
        files: tuple[LayerFile, ...] = (),
    ) -> int:
        """Rebuild the writable layer from the checkpoint, write `files` into it (only where
        `places_files`) and resume its processes; with a `transfer` (only where `lazy_restore`),
        before their memory has all arrived. Returns the sandbox's init PID."""

    def revive(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        """Resume a sandbox stopped right after its dump from those images, in its own writable
        layer, which nothing has written since."""


class Backend(Protocol):
    """Starts, pauses and stops a node's containers; their checkpoints are `checkpoints`'."""

    name: str
    wants_netns: bool
    """True if the node must make the sandbox's netns (see `network.netns_path`) before create."""
    user_namespaces: bool
    """Whether sandboxes may run in a user namespace of their own (`AgentSettings.userns_base`)."""
    runs_verifiers: bool
    """Whether a verifier may see an exited sandbox's final tree (`mount_graded`)."""

    @property
    def checkpoints(self) -> Checkpoints:
        """Dumps and restores of this runtime's sandboxes."""

    def create(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        files: dict[str, bytes],
        graded: Path | None = None,
    ) -> None:
        """Build the container with its rootfs and files, without starting it. `graded` (a
        verifier's view of an exited sandbox's final tree) is mounted at GRADED_MOUNT read-only,
        nosuid, nodev and noexec: data to read, never code to run."""

    def start(self, record: SandboxRecord, layout: SandboxLayout) -> None: ...

    def upper_dir(self, record: SandboxRecord, layout: SandboxLayout) -> Path:
        """The writable layer of the running sandbox."""

    def freeze(self, record: SandboxRecord, layout: SandboxLayout) -> None: ...

    def thaw(self, record: SandboxRecord, layout: SandboxLayout) -> None: ...

    def status(self, record: SandboxRecord, layout: SandboxLayout) -> tuple[SandboxState, int]:
        """The sandbox's state and its init PID (0 if none)."""

    def kill(self, record: SandboxRecord, layout: SandboxLayout, signal: int) -> None: ...

    def destroy(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        """Remove the container and everything of it on the node; absent pieces are fine."""

    def mount_graded(self, layout: SandboxLayout, image: Image, userns_base: int) -> Path:
        """Mount an exited sandbox's final tree, read-only, as a verifier with those ids sees it
        (only where `runs_verifiers`)."""

    def oci_spec(self, record: SandboxRecord, layout: SandboxLayout) -> dict[str, Any]: ...

    def remove_leftovers(self, keep: set[str]) -> list[str]:
        """Remove this node's containers that have no record; returns their ids."""

    def warm(self, userns_base: int) -> None:
        """Make ahead, in the background, what the first sandboxes will need (theirs with ids
        from `userns_base`, 0 for none)."""

    def close(self) -> None:
        """Stop that background work and remove what it made; sandboxes are left as they are."""
