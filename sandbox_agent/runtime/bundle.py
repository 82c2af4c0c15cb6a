"""A runc sandbox's bundle: the OCI spec (`config.json`) its record becomes, and what CRIU needs
of it (`external_mounts`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandbox_agent.criu.core import Mounts
from sandbox_agent.host import idmap, network, seccomp
from sandbox_agent.runtime.backend import GRADED_MOUNT, SandboxLayout, wrapped_command
from sandbox_agent.spec import SandboxRecord

CGROUP_PARENT = "stasis"

# Docker's default capability set without NET_RAW (no forged packets), MKNOD (the devices
# cgroup refuses every node anyway), SETFCAP (no file capabilities to hand out) and AUDIT_WRITE:
# enough for a harness to install packages, chown files and switch users.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
]  # fmt: skip

_MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
     "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
]  # fmt: skip

_MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
    "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
]  # fmt: skip


def cgroups_path(host_key: str, sandbox_id: str) -> str:
    """The sandbox's cgroups below each hierarchy: named by the node's `host_key`."""
    return f"/{CGROUP_PARENT}/{host_key}/{sandbox_id}"


def oci_spec(
    record: SandboxRecord, layout: SandboxLayout, host_key: str, ids: idmap.IdMap | None, criu_config: Path
) -> dict[str, Any]:
    """The OCI spec runc runs the sandbox by; `ids` maps its user namespace (None for none)."""
    spec = record.spec
    res = spec.resources
    kinds = ("pid", "ipc", "uts", "mount", *(("user",) if ids else ()))
    namespaces: list[dict[str, str]] = [{"type": t} for t in kinds]
    # The netns stays the node's, so that it can wire it; the sandbox only uses it.
    namespaces.append({"type": "network", "path": str(network.netns_path(host_key, record.id))})
    caps = list(CAPABILITIES)
    mounts = _MOUNTS
    if ids:
        # sysfs may be mounted only by the owner of the netns: the node mounts one for it.
        sysfs = {"destination": "/sys", "type": "bind", "source": str(layout.sysfs),
                 "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}  # fmt: skip
        mounts = [sysfs if m["destination"] == "/sys" else m for m in _MOUNTS]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": spec.ids[0], "gid": spec.ids[1]},
            "args": wrapped_command(spec.command),
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                f"HOSTNAME={spec.hostname}",
                *(f"{k}={v}" for k, v in sorted(spec.env.items())),
            ],
            "cwd": spec.cwd,
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            # The host's hard limit here is 20000; asking for more fails at start.
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(layout.rootfs), "readonly": False},
        "hostname": spec.hostname,
        "mounts": mounts,
        "annotations": {"org.criu.config": str(criu_config)},
        "linux": {
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": res.memory_mb << 20},
                "cpu": {"quota": int(res.cpus * 100_000), "period": 100_000},
                "pids": {"limit": res.pids},
            },
            "cgroupsPath": cgroups_path(host_key, record.id),
            "namespaces": namespaces,
            **(ids.oci() if ids else {}),
            "seccomp": seccomp.profile(),
            "maskedPaths": _MASKED_PATHS,
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def write(layout: SandboxLayout, spec: dict[str, Any], graded: Path | None = None) -> dict[str, Any]:
    """Write runc's bundle (its config.json) and return the spec written; `graded` (a verifier's
    view of a graded sandbox's tree) is mounted at GRADED_MOUNT."""
    if graded is not None:
        spec["mounts"] = [*spec["mounts"], {
            "destination": GRADED_MOUNT, "type": "bind", "source": str(graded),
            # nosymfollow: a harness's symlink (to /tests/expected.txt) must not lead the
            # verifier into its own hidden files.
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec", "nosymfollow"],
        }]  # fmt: skip
    layout.bundle.mkdir(parents=True, exist_ok=True)
    (layout.bundle / "config.json").write_text(json.dumps(spec, indent=1))
    return spec


def read(layout: SandboxLayout) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((layout.bundle / "config.json").read_text())
    return spec


def external_mounts(layout: SandboxLayout) -> Mounts:
    """The bundle's bind mounts and masked paths, as CRIU is told of them."""
    spec = read(layout)
    binds = tuple((m["destination"], m["source"]) for m in spec["mounts"] if m["type"] == "bind")
    return Mounts(binds=binds, masked=tuple(spec["linux"]["maskedPaths"]))
