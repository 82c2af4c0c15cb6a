"""The Docker backend: a Docker Engine (experimental mode) runs the sandbox; CRIU through its checkpoint API.

Docker 20.10 cannot restore from a checkpoint directory of our choosing, so a restore creates a
NEW container, copies the CRIU images into its `checkpoints/<name>` folder and the writable layer
into its overlay upper dir, then starts it from that checkpoint.
"""

from __future__ import annotations

import io
import json
import shutil
import signal as signals
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from sandbox_agent.checkpoint import CheckpointImage
from sandbox_agent.criu.lazy import Transfer
from sandbox_agent.errors import AgentError, CommandFailed, FailedPrecondition, NotFound, ToolUnavailable
from sandbox_agent.host import overlay, tools
from sandbox_agent.images.cache import Image, ImageCache
from sandbox_agent.runtime.backend import STATE_DIR, STOP_TIMEOUT_S, LayerFile, SandboxLayout, wrapped_command
from sandbox_agent.spec import SandboxRecord, SandboxState

CHECKPOINT_NAME = "stasis"
IMAGE_REPOSITORY = "stasis-image"


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """The one place Docker's errors become the agent's."""
    try:
        yield
    except docker.errors.NotFound as exc:
        raise NotFound(f"{what}: {exc.explanation or exc}") from exc
    except docker.errors.APIError as exc:
        raise CommandFailed(
            argv=("docker", what),
            returncode=exc.status_code or -1,
            stderr_tail=str(exc.explanation or exc),
            what=what,
        ) from exc
    except docker.errors.DockerException as exc:
        raise ToolUnavailable(f"{what}: Docker Engine unreachable: {exc}") from exc
    except OSError as exc:
        if isinstance(exc, AgentError):
            raise
        raise ToolUnavailable(f"{what}: {exc}") from exc


def _client(url: str) -> docker.DockerClient:
    with _translated("connecting to Docker"):
        return docker.DockerClient(base_url=url, version="auto", timeout=300)


def import_docker_image(cache: ImageCache, ref: str, name: str, docker_url: str) -> Image:
    """Import a local Docker image's root filesystem into the node's image cache."""
    with (
        closing(_client(docker_url)) as client,
        _translated(f"exporting Docker image {ref!r}"),
        tempfile.TemporaryDirectory(dir=cache.root) as tmp,
    ):
        client.images.get(ref)
        container = client.containers.create(ref, command=["/bin/true"], network_mode="none")
        try:
            tar = Path(tmp) / "rootfs.tar"
            with open(tar, "wb") as f:
                for chunk in container.export():
                    f.write(chunk)
        finally:
            container.remove(force=True)
        return cache.import_tarball(tar, name=name or ref)


class DockerBackend:
    name = "docker"
    wants_netns = False
    """Docker makes its own network namespace (`none`: loopback only)."""
    user_namespaces = False
    """Docker's containers share the host's ids."""
    runs_verifiers = False
    """Verifiers need the runc backend."""

    def warm(self, userns_base: int) -> None:
        pass  # Docker makes each container's layer itself

    def close(self) -> None:
        self.client.close()

    def __init__(self, node: str, url: str) -> None:
        self.node = node
        self.client = _client(url)
        with _translated("reading Docker's info"):
            info = self.client.info()
        self.docker_root = Path(info["DockerRootDir"])
        if not info.get("ExperimentalBuild"):
            raise ToolUnavailable("the Docker Engine must run with experimental mode on for checkpoints")
        self.checkpoints = DockerCheckpoints(self)

    def container(self, record: SandboxRecord) -> Container:
        with _translated(f"looking up the container of sandbox {record.id}"):
            return self.client.containers.get(self._name(record))

    def _name(self, record: SandboxRecord) -> str:
        return f"stasis-{self.node}-{record.id}"

    def _docker_image(self, image: Image) -> str:
        tag = f"{IMAGE_REPOSITORY}:{image.digest.removeprefix('sha256:')[:20]}"
        with _translated(f"importing image {image.digest} into Docker"):
            try:
                self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                with tempfile.TemporaryDirectory() as tmp:
                    tar = Path(tmp) / "rootfs.tar"
                    tools.run(
                        [
                            "tar",
                            "-C",
                            str(image.rootfs),
                            "--xattrs",
                            "--xattrs-include=*",
                            "--numeric-owner",
                            "-cf",
                            str(tar),
                            ".",
                        ],
                        what="archiving image for Docker",
                    )
                    repo, version = tag.split(":")
                    self.client.api.import_image(src=str(tar), repository=repo, tag=version)
        return tag

    def create_container(self, record: SandboxRecord, image: Image) -> Container:
        spec = record.spec
        res = spec.resources
        with _translated(f"creating the container of sandbox {record.id}"):
            return self.client.containers.create(
                self._docker_image(image),
                command=wrapped_command(spec.command),
                entrypoint=[],
                name=self._name(record),
                hostname=spec.hostname,
                environment=spec.env,
                working_dir=spec.cwd or "/",
                user=spec.user or "0:0",
                network_mode="none",
                labels={"stasis.node": self.node, "stasis.sandbox": record.id},
                mem_limit=res.memory_mb << 20,
                nano_cpus=int(res.cpus * 1e9),
                pids_limit=res.pids,
                cap_drop=["NET_RAW"],
            )

    def create(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        files: dict[str, bytes],
        graded: Path | None = None,
    ) -> None:
        if graded is not None:
            raise FailedPrecondition("the docker backend cannot run verifiers; use runc")
        container = self.create_container(record, image)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            state_dir = tarfile.TarInfo(STATE_DIR.lstrip("/"))
            state_dir.type, state_dir.mode, state_dir.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            state_dir.uid, state_dir.gid = record.spec.ids
            tar.addfile(state_dir)
            for path, content in files.items():
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode, info.mtime = len(content), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(content))
        with _translated(f"placing files in sandbox {record.id}"):
            container.put_archive("/", buf.getvalue())

    def start(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        container = self.container(record)
        with _translated(f"starting sandbox {record.id}"):
            container.start()

    def upper_dir(self, record: SandboxRecord, layout: SandboxLayout) -> Path:
        return Path(self.container(record).attrs["GraphDriver"]["Data"]["UpperDir"])

    def freeze(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        with _translated(f"freezing sandbox {record.id}"):
            self.container(record).pause()

    def thaw(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        with _translated(f"thawing sandbox {record.id}"):
            self.container(record).unpause()

    def status(self, record: SandboxRecord, layout: SandboxLayout) -> tuple[SandboxState, int]:
        try:
            container = self.container(record)
        except NotFound:
            return SandboxState.EXITED, 0
        state = container.attrs["State"]
        if state.get("Paused"):
            return SandboxState.PAUSED, int(state.get("Pid", 0))
        if state.get("Running"):
            return SandboxState.RUNNING, int(state.get("Pid", 0))
        return SandboxState.EXITED, 0

    def stop(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        self.kill(record, layout, signals.SIGKILL)
        with _translated(f"stopping sandbox {record.id}"):
            self.container(record).wait(timeout=STOP_TIMEOUT_S)

    def kill(self, record: SandboxRecord, layout: SandboxLayout, signal: int) -> None:
        state, _ = self.status(record, layout)
        if state == SandboxState.EXITED:
            return
        container = self.container(record)
        with _translated(f"killing sandbox {record.id}"):
            if state == SandboxState.PAUSED:
                container.unpause()
            container.kill(signal=signal)

    def destroy(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        try:
            container = self.container(record)
        except NotFound:
            return
        with _translated(f"removing sandbox {record.id}"):
            container.remove(force=True, v=True)

    def mount_graded(self, layout: SandboxLayout, image: Image, userns_base: int) -> Path:
        raise FailedPrecondition(f"node {self.node} runs docker; verifiers need the runc backend")

    def oci_spec(self, record: SandboxRecord, layout: SandboxLayout) -> dict[str, Any]:
        container = self.container(record)
        for bundle in Path("/run").glob(
            f"*/containerd/**/io.containerd.runtime.v2.task/*/{container.id}/config.json"
        ):
            spec: dict[str, Any] = json.loads(bundle.read_text())
            return spec
        return {
            "ociVersion": "1.0.2",
            "annotations": {"org.stasis.docker.config": str(container.attrs.get("Config"))},
        }

    def remove_leftovers(self, keep: set[str]) -> list[str]:
        removed = []
        with _translated("listing this node's containers"):
            for container in self.client.containers.list(
                all=True, filters={"label": f"stasis.node={self.node}"}
            ):
                sandbox = container.labels.get("stasis.sandbox", "")
                if sandbox not in keep:
                    container.remove(force=True, v=True)
                    removed.append(sandbox)
        return removed


class DockerCheckpoints:
    """Dumps and restores through Docker's checkpoint API (CRIU, run by Docker's runtime)."""

    lazy_restore = False
    """Docker restores from a checkpoint it has whole."""
    restore_timeout_s = 300.0
    """Docker's own limits apply; kept for the interface."""
    places_files = False
    """Docker builds the restored container's layer; a fork child restores on runc."""

    def __init__(self, docker: DockerBackend) -> None:
        self.docker = docker

    def _checkpoints_dir(self, container: Container) -> Path:
        return self.docker.docker_root / "containers" / str(container.id) / "checkpoints"

    def dump(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        container = self.docker.container(record)
        api = self.docker.client.api
        with _translated(f"CRIU dump of sandbox {record.id}"):
            # A paused container stays paused after a leave-running dump.
            res = api._post_json(
                api._url("/containers/{0}/checkpoints", container.id),
                data={"CheckpointID": CHECKPOINT_NAME, "Exit": False},
            )
            api._raise_for_status(res)
        source = self._checkpoints_dir(container) / CHECKPOINT_NAME
        shutil.move(str(source), images_dir)

    def prepare_restore(self, record: SandboxRecord, layout: SandboxLayout) -> None:
        """Nothing: Docker makes the container, and its layer, from the checkpoint's image."""

    def restore(
        self,
        record: SandboxRecord,
        layout: SandboxLayout,
        image: Image,
        checkpoint: CheckpointImage,
        transfer: Transfer | None = None,
        files: tuple[LayerFile, ...] = (),
    ) -> int:
        if transfer is not None:
            raise FailedPrecondition("the docker backend restores memory eagerly only")
        if files:
            raise FailedPrecondition("the docker backend writes no files into a restored layer")
        container = self.docker.create_container(record, image)
        overlay.import_layer(checkpoint.layer, Path(container.attrs["GraphDriver"]["Data"]["UpperDir"]))
        self._start_from(record, container, checkpoint.criu_dir)
        return self.docker.status(record, layout)[1]

    def _start_from(self, record: SandboxRecord, container: Container, images_dir: Path) -> None:
        target = self._checkpoints_dir(container) / CHECKPOINT_NAME
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(images_dir, target)
        # Docker uploads the images to containerd as one tar, and refuses ("already exists") when
        # containerd still holds the same tar from the dump; a file CRIU ignores makes each unique.
        (target / "stasis-restore").write_text(uuid.uuid4().hex)
        api = self.docker.client.api
        with _translated(f"CRIU restore of sandbox {record.id}"):
            res = api._post(
                api._url("/containers/{0}/start", container.id), params={"checkpoint": CHECKPOINT_NAME}
            )
            api._raise_for_status(res)

    def dump_and_stop(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> float | None:
        self.docker.freeze(record, layout)
        try:
            self.dump(record, layout, images_dir)
        except BaseException:
            self.docker.thaw(record, layout)
            raise
        self.docker.stop(record, layout)
        return None

    def revive(self, record: SandboxRecord, layout: SandboxLayout, images_dir: Path) -> None:
        self._start_from(record, self.docker.container(record), images_dir)
