"""Settings of one node agent, built once at start-up from flags and environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from protos.shared.tls import TlsFiles

DEFAULT_BASE_IMAGE_TAR = Path("/var/cache/stasis/images/base/rootfs.tar")

MEMORY_STAGING_MAX_BYTES = 64 << 20
"""The most a restore stages in `AgentSettings.memory_dir`: its CRIU images but for the pages, and
its layer, are usually well under a MiB; a large layer goes to disk, not into the node's memory."""


@dataclass(frozen=True)
class JoinSettings:
    """How a node without a certificate gets one (`joining`)."""

    address: str
    """HOST:PORT of the orchestrator's public API."""
    token_file: Path
    """The proof: this agent pod's Kubernetes service-account token, for the audience `stasis`."""
    ca: Path
    """The cluster CA's certificate: the orchestrator's own must come from it."""


@dataclass(frozen=True)
class AgentSettings:
    node: str
    """Node name; unique in the cluster. With `stack` it keys what the agent holds on the host
    (`host_key`)."""
    root: Path
    """The agent's own state root: image cache, sandboxes, staging. Two agents never share one."""
    stack: str = ""
    """The stack (one orchestrator and its nodes) this agent belongs to, when several share a
    host: two stacks may both have a node-1. `stasis up` names each after its state dir. Empty:
    the host's only stack, whose names carry no stack."""
    backend: str = "runc"
    """`runc` (default: no daemon in the checkpoint path) or `docker` (a Docker Engine on the node)."""
    listen: str = "127.0.0.1:0"
    """gRPC listen address; port 0 picks a free one and the agent prints it."""
    image_cache: Path | None = None
    """Read-only image trees, keyed by digest; default <root>/images. Nodes on one machine may share one."""
    base_image_tar: Path | None = DEFAULT_BASE_IMAGE_TAR
    """Imported as image `base` at start if the cache lacks it; built by scripts/host-setup.sh."""
    run_dir: Path = Path("/run/stasis")
    """Where sandboxes' root filesystems are mounted (under <run_dir>/<node>): every directory on
    the way must be searchable by others, since a sandbox's ids are unprivileged on the host."""
    memory_dir: Path | None = Path("/dev/shm")
    """A tmpfs where a lazy restore stages the snapshot's files other than its memory pages (which
    stay in the store), when they fit in `MEMORY_STAGING_MAX_BYTES` and in half its free space:
    on a disk busy writing back a checkpoint, creating those ~30 small files cost 10-15 ms of the
    restore. The node uses <memory_dir>/stasis-<node>, a dir only its user may enter. None stages
    on <root>/staging, as eager restores and larger files always do."""
    userns_base: int = 100_000
    """The host uid and gid of a sandbox's root: its ids 0..65535 are host ids from here on, on
    every node alike (a snapshot carries the map). 0 runs sandboxes without a user namespace, as
    the node's own root; only for hosts without id-mapped mounts."""
    criu: str = "criu"
    """CRIU binary; 4.2 or newer is needed on kernels >= 6.16 for TCP sockets."""
    lazy_restore: bool = True
    """Restore from the snapshot store lazily where the backend can (runc): the sandbox runs
    once its small images are here, and its memory follows as it touches it (`lazy`)."""
    allowed_ports: tuple[int, ...] = ()
    """TCP ports on 169.254.1.1 that sandboxes may reach (the inference gateway's); all else is dropped."""
    slots: int = 4
    """Sandboxes this node runs at once; the scheduler never places more."""
    memory_mb: int = 16384
    """Memory the node offers to sandboxes, in MiB."""
    disk_mb: int = 0
    """Disk the node offers to sandboxes, in MiB (`node/disk.py`): each holds its layer's
    `resources.disk_mb` while it exists, and a checkpoint or restore the room to stage it. 0
    offers 90 % of what the filesystem of `root` has free at start; nodes that share a disk
    should be given their shares."""
    docker_url: str = "unix:///var/run/docker.sock"
    """Docker Engine for the docker backend."""
    snapshot_store: str = ""
    """Snapshot store URL shared by all nodes and the orchestrator (file:///shared/dir or s3://bucket/prefix)."""
    orchestrator: str = ""
    """Orchestrator address to register and heartbeat with, or several, comma-separated (replicas
    of which one leads); empty runs the agent standalone."""
    advertise: str = ""
    """Address the orchestrator should dial for this agent; empty means the bound listen address."""
    gateway_forward: str = ""
    """HOST:PORT of the orchestrator's gateway; the node relays 169.254.1.1:<gateway_port> to it,
    over TLS with `tls` (the gateway then knows the node by its certificate). Empty when the
    gateway listens on 169.254.1.1 itself (the local stack)."""
    gateway_port: int = 8080
    """Port on 169.254.1.1 where sandboxes find the gateway; also allowed through the isolation rules."""
    drain_on_stop_s: float = 0.0
    """On SIGTERM, have the orchestrator drain this node and wait up to this long for its
    sandboxes to be checkpointed away before stopping; 0 stops at once (sandboxes keep running,
    and a restarted agent picks them up)."""
    heartbeat_s: float = 1.0
    """Heartbeat period; the orchestrator declares a node lost after several missed ones."""
    labels: dict[str, str] = field(default_factory=dict)
    registry_auth_file: Path | None = None
    """A docker config.json holding registry credentials; read by skopeo, never logged or sent on."""
    registry_certs: Path | None = None
    """CA certificates of registries with private CAs, as <dir>/<host[:port]>/ca.crt."""
    tls: TlsFiles | None = None
    """This node's certificate from the cluster CA: it serves only the orchestrator with it, and
    registers as the node it names. None (`--insecure`) accepts calls from anyone."""
    join: JoinSettings | None = None
    """Get `tls` from the orchestrator at start-up, by proving which node this is."""
    insecure_registries: tuple[str, ...] = ()
    """Registries (host[:port]) spoken to over plain HTTP; those on loopback addresses always may."""

    @property
    def host_key(self) -> str:
        """What names this agent's things on the host, where every stack's agents meet: its
        sandboxes' cgroups, netns and veths, its gateway allowances, its run and staging dirs.
        The node's name, then its stack's after a dot (a stack's name has none)."""
        return f"{self.node}.{self.stack}" if self.stack else self.node
