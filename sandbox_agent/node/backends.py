"""The runtime a node's settings choose, and CRIU as that runtime needs it on the host."""

from __future__ import annotations

from pathlib import Path

from sandbox_agent.criu.core import Criu
from sandbox_agent.errors import InvalidSpec
from sandbox_agent.host import cgroups, overlay, tools
from sandbox_agent.host.layer_disks import LayerDisks
from sandbox_agent.runtime.backend import Backend
from sandbox_agent.runtime.rootfs import RootFs
from sandbox_agent.runtime.runc import RuncBackend
from sandbox_agent.settings import AgentSettings

IRMAP_SCAN_PATHS = ("/root", "/home", "/tmp", "/work", "/workspace", "/app")
"""Where CRIU looks for the files a harness watches (inotify, fanotify), inside the sandbox
(/app: a Harbor task's work dir)."""


CRIU_RUNDIR = Path("/run/criu")
"""Where CRIU (built by scripts/host-setup.sh with RUNDIR=/run/criu) caches what it probed of
the kernel. It keeps the cache only on a tmpfs, so that a reboot drops it; the node mounts one."""


def keep_criu_cache() -> None:
    """Give CRIU its tmpfs: without it every dump and restore probes the kernel again (~40 ms)."""
    CRIU_RUNDIR.mkdir(parents=True, exist_ok=True)
    if not overlay.is_mounted(CRIU_RUNDIR):
        tools.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                "size=1m,mode=0755,nosuid,nodev,noexec",
                "tmpfs",
                str(CRIU_RUNDIR),
            ],
            what=f"mounting CRIU's cache at {CRIU_RUNDIR}",
        )


def make_backend(settings: AgentSettings) -> Backend:
    keep_criu_cache()
    if settings.backend == "runc":
        conf = settings.root / "criu-runc.conf"
        # TCP connections come back closed, so the harness's HTTP client reconnects (and a fork
        # child, whose address is not its parent's, can restore them at all). runc makes
        # and fills the sandbox's cgroups and restores CRIU into them, so CRIU leaves cgroups
        # alone (dumping them took 15 ms of each freeze). A watched file's path is found by
        # scanning: harnesses watch their home and work dirs (Claude Code watches ~/.claude with
        # inotify), which CRIU's default scan misses. A task leaving CRIU's parasite or restorer
        # code is stopped by tracing its syscalls: a hardware breakpoint cost some 10 ms of every
        # freeze on the VMs measured (scripts/criu-patches/breakpoints-option.patch).
        scans = "".join(f"irmap-scan-path {p}\n" for p in IRMAP_SCAN_PATHS)
        conf.write_text("tcp-close\nnetwork-lock skip\nmanage-cgroups=ignore\nno-breakpoints\n" + scans)
        disks = LayerDisks(settings.root / "layer-disks")
        cgroups.favor_moves()  # every restore moves CRIU into the sandbox's cgroups
        rootfs = RootFs(settings.host_key, disks)
        return RuncBackend(settings.host_key, settings.root / "runc", Criu(settings.criu, conf), rootfs)
    if settings.backend == "docker":
        from sandbox_agent.runtime.docker_backend import DockerBackend

        return DockerBackend(settings.host_key, settings.docker_url)
    raise InvalidSpec("backend", f"{settings.backend!r} is not a backend; use runc or docker")
