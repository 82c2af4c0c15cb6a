"""`stasis-agent`: one node agent process."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from protos.shared.address import host_of, join_host_port
from protos.shared.tls import TlsFiles
from sandbox_agent.errors import AgentError
from sandbox_agent.host.network import GATEWAY_IP
from sandbox_agent.node import Node
from sandbox_agent.server.forwarder import Forwarder, parse_target
from sandbox_agent.server.joining import Renewal, joined
from sandbox_agent.server.registration import Registration
from sandbox_agent.server.service import serve
from sandbox_agent.settings import DEFAULT_BASE_IMAGE_TAR, AgentSettings, JoinSettings
from snapshots import set_aside_startup_objects


def parser() -> argparse.ArgumentParser:
    """The agent's flags, each defaulting to its $STASIS_* variable where it has one."""
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="stasis-agent",
        description="The Stasis node agent: runs, checkpoints and restores the sandboxes the "
        "orchestrator places on this node.\n\nGive it this node's certificate from the cluster CA "
        "(--tls-ca, --tls-cert, --tls-key), --join to get one, or --insecure.",
        epilog="""Examples:
  # A node of a development cluster, registering with an orchestrator on this host
  stasis-agent --node node-1 --insecure --orchestrator 127.0.0.1:7070 --gateway-forward 127.0.0.1:8080

  # A node with its certificate, two orchestrator replicas and a shared snapshot store
  stasis-agent --node node-1 --tls-ca ca.crt --tls-cert node-1.crt --tls-key node-1.key --orchestrator stasis-a:7071,stasis-b:7071 --snapshot-store s3://rollouts/snapshots --advertise 10.0.0.11:7443 --listen 0.0.0.0:7443

  # A node in Kubernetes that proves which node it is to get its certificate
  stasis-agent --node node-1 --tls-ca /etc/stasis/ca.crt --join stasis.stasis.svc:7070 --join-token-file /var/run/secrets/stasis/token --orchestrator stasis.stasis.svc:7071""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--node",
        default=env("STASIS_NODE", ""),
        required=not env("STASIS_NODE"),
        metavar="NAME",
        help="this node's name, unique in the cluster (default: $STASIS_NODE; required without it)",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=Path(env("STASIS_AGENT_ROOT", "/var/lib/stasis/agent")),
        metavar="DIR",
        help="the agent's own state: image cache, sandboxes, staging; two agents never share one "
        "(default %(default)s; $STASIS_AGENT_ROOT sets it)",
    )
    p.add_argument(
        "--stack",
        default=env("STASIS_STACK", ""),
        metavar="NAME",
        help="the stack this node belongs to where several share a host (keys its cgroups, netns, "
        "veths and gateway allowances); [a-z0-9-], empty for the host's only stack (default: $STASIS_STACK)",
    )
    p.add_argument(
        "--image-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="read-only image trees, by digest; nodes on one machine may share one (default: ROOT/images)",
    )
    p.add_argument(
        "--backend",
        choices=("runc", "docker"),
        default=env("STASIS_BACKEND", "runc"),
        help="runc (no daemon in the checkpoint path) or docker (the Docker Engine on this node) "
        "(default %(default)s; $STASIS_BACKEND sets it)",
    )
    p.add_argument(
        "--listen",
        default=env("STASIS_AGENT_LISTEN", "127.0.0.1:0"),
        metavar="HOST:PORT",
        help="the agent's gRPC API; port 0 picks a free one, which it prints "
        "(default %(default)s; $STASIS_AGENT_LISTEN sets it)",
    )
    p.add_argument(
        "--base-image-tar",
        type=Path,
        default=Path(env("STASIS_BASE_IMAGE_TAR", str(DEFAULT_BASE_IMAGE_TAR))),
        metavar="FILE",
        help="root filesystem tarball imported as image `base` at start if the cache lacks it "
        "(default %(default)s; $STASIS_BASE_IMAGE_TAR sets it)",
    )
    p.add_argument(
        "--criu",
        default=env("STASIS_CRIU", "criu"),
        metavar="PATH",
        help="the CRIU binary; 4.2 or newer on kernels 6.16 and later (default %(default)s; $STASIS_CRIU sets it)",
    )
    p.add_argument(
        "--eager-restore",
        action="store_true",
        default=bool(env("STASIS_EAGER_RESTORE")),
        help="fetch a snapshot's whole memory before restoring it (default: lazily, as the sandbox "
        "touches it; $STASIS_EAGER_RESTORE turns it on)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path(env("STASIS_RUN_DIR", "/run/stasis")),
        metavar="DIR",
        help="where sandboxes' root filesystems are mounted; every directory on the way searchable "
        "(default %(default)s; $STASIS_RUN_DIR sets it)",
    )
    p.add_argument(
        "--memory-dir",
        type=_path,
        default=_path(env("STASIS_MEMORY_DIR", "/dev/shm")),
        metavar="DIR",
        help="a tmpfs where lazy restores stage the snapshot's small files; empty: on disk "
        "(default %(default)s; $STASIS_MEMORY_DIR sets it)",
    )
    p.add_argument(
        "--userns-base",
        type=int,
        default=int(env("STASIS_USERNS_BASE", "100000")),
        metavar="ID",
        help="host uid/gid of a sandbox's root (its 65536 ids follow); the same on every node; 0: no "
        "user namespace (default %(default)s; $STASIS_USERNS_BASE sets it)",
    )
    p.add_argument(
        "--allow-port",
        type=int,
        action="append",
        default=[],
        metavar="PORT",
        help="a TCP port on 169.254.1.1 sandboxes may reach; repeatable (default: none but --gateway-port, "
        "with --gateway-forward)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=int(env("STASIS_SLOTS", "4")),
        metavar="N",
        help="sandboxes this node runs at once (default %(default)s; $STASIS_SLOTS sets it)",
    )
    p.add_argument(
        "--memory-mb",
        type=int,
        default=int(env("STASIS_MEMORY_MB", "16384")),
        metavar="MIB",
        help="memory the node offers its sandboxes, in MiB (default %(default)s; $STASIS_MEMORY_MB sets it)",
    )
    p.add_argument(
        "--disk-mb",
        type=int,
        default=int(env("STASIS_DISK_MB", "0")),
        metavar="MIB",
        help="disk the node offers its sandboxes' layers and checkpoints, in MiB; 0: 90%% of what is "
        "free at start (default %(default)s; $STASIS_DISK_MB sets it)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of this node; repeatable (default: none)",
    )
    p.add_argument(
        "--snapshot-store",
        default=env("STASIS_SNAPSHOT_STORE", ""),
        metavar="URL",
        help="snapshot store shared with the orchestrator and every node, file:///DIR or "
        "s3://BUCKET/PREFIX (default: $STASIS_SNAPSHOT_STORE)",
    )
    p.add_argument(
        "--orchestrator",
        default=env("STASIS_ORCHESTRATOR", ""),
        metavar="HOST:PORT[,...]",
        help="the orchestrator's node registry to register with; several, comma-separated, for "
        "replicas (the leader answers); empty: standalone (default: $STASIS_ORCHESTRATOR)",
    )
    p.add_argument(
        "--advertise",
        default=env("STASIS_ADVERTISE", ""),
        metavar="HOST:PORT",
        help="the address the orchestrator dials for this agent; empty: the bound --listen address "
        "(default: $STASIS_ADVERTISE)",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=float(env("STASIS_HEARTBEAT_S", "1.0")),
        metavar="SECONDS",
        help="heartbeat period; the orchestrator declares a node lost after several missed ones "
        "(default %(default)s; $STASIS_HEARTBEAT_S sets it)",
    )
    p.add_argument(
        "--gateway-forward",
        default=env("STASIS_GATEWAY_FORWARD", ""),
        metavar="HOST:PORT",
        help="the orchestrator's gateway: relay 169.254.1.1:GATEWAY_PORT to it, over TLS with this "
        "node's certificate; empty: the gateway listens on 169.254.1.1 itself (default: $STASIS_GATEWAY_FORWARD)",
    )
    p.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process dies")
    p.add_argument(
        "--drain-on-stop",
        type=float,
        default=float(env("STASIS_DRAIN_ON_STOP_S", "0")),
        metavar="SECONDS",
        help="on SIGTERM, have the orchestrator drain this node and wait up to SECONDS for its sandboxes "
        "to move; 0: stop at once, leaving them running (default %(default)s; $STASIS_DRAIN_ON_STOP_S sets it)",
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=int(env("STASIS_GATEWAY_PORT", "8080")),
        metavar="PORT",
        help="port on 169.254.1.1 where sandboxes find the gateway (default %(default)s; "
        "$STASIS_GATEWAY_PORT sets it)",
    )
    p.add_argument(
        "--registry-auth-file",
        type=Path,
        default=_path(env("STASIS_REGISTRY_AUTH_FILE", "")),
        metavar="FILE",
        help="docker config.json with registry credentials; empty: none (default: $STASIS_REGISTRY_AUTH_FILE)",
    )
    p.add_argument(
        "--registry-certs",
        type=Path,
        default=_path(env("STASIS_REGISTRY_CERTS", "")),
        metavar="DIR",
        help="dir of <host[:port]>/ca.crt for registries with private CAs; empty: none "
        "(default: $STASIS_REGISTRY_CERTS)",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[r for r in env("STASIS_INSECURE_REGISTRIES", "").split(",") if r],
        metavar="HOST[:PORT]",
        help="a registry reached over plain HTTP; repeatable, loopback ones always are "
        "(default: $STASIS_INSECURE_REGISTRIES, comma-separated)",
    )
    p.add_argument(
        "--tls-ca",
        type=Path,
        default=_path(env("STASIS_TLS_CA", "")),
        metavar="FILE",
        help="cluster CA certificate (default: $STASIS_TLS_CA)",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        default=_path(env("STASIS_TLS_CERT", "")),
        metavar="FILE",
        help="this node's certificate from the cluster CA (default: $STASIS_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        type=Path,
        default=_path(env("STASIS_TLS_KEY", "")),
        metavar="FILE",
        help="its private key (default: $STASIS_TLS_KEY)",
    )
    p.add_argument(
        "--join",
        default=env("STASIS_JOIN", ""),
        metavar="HOST:PORT",
        help="the orchestrator's public API: get this node's certificate there (with --tls-ca and "
        "--join-token-file); empty: no joining (default: $STASIS_JOIN)",
    )
    p.add_argument(
        "--join-token-file",
        type=Path,
        default=_path(env("STASIS_JOIN_TOKEN_FILE", "")),
        metavar="FILE",
        help="this pod's Kubernetes service-account token (audience stasis), proving which node it is "
        "(default: $STASIS_JOIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=bool(env("STASIS_INSECURE")),
        help="serve plaintext gRPC to anyone who reaches --listen (development only; default: on if "
        "$STASIS_INSECURE is set)",
    )
    return p


def settings_from_args(argv: list[str] | None = None) -> AgentSettings:
    p = parser()
    a = p.parse_args(argv)
    tls_files = (a.tls_ca, a.tls_cert, a.tls_key)
    if a.join:
        if not (a.tls_ca and a.join_token_file) or a.tls_cert or a.tls_key or a.insecure:
            p.error("--join takes --tls-ca and --join-token-file, and no --tls-cert, --tls-key or --insecure")
    elif any(tls_files) and not all(tls_files):
        p.error("--tls-ca, --tls-cert and --tls-key go together")
    elif not all(tls_files) and not a.insecure:
        p.error(
            "give this node's certificate from the cluster CA (--tls-ca, --tls-cert, --tls-key), "
            "--join to get one from the orchestrator, or --insecure to accept calls from anyone"
        )
    labels = dict(kv.split("=", 1) for kv in a.label if "=" in kv)
    return AgentSettings(
        node=a.node,
        root=a.root,
        stack=a.stack,
        image_cache=a.image_cache,
        backend=a.backend,
        listen=a.listen,
        base_image_tar=a.base_image_tar,
        criu=a.criu,
        lazy_restore=not a.eager_restore,
        run_dir=a.run_dir,
        memory_dir=a.memory_dir,
        userns_base=a.userns_base,
        allowed_ports=tuple(dict.fromkeys([*a.allow_port, *([a.gateway_port] if a.gateway_forward else [])])),
        slots=a.slots,
        memory_mb=a.memory_mb,
        disk_mb=a.disk_mb,
        labels=labels,
        snapshot_store=a.snapshot_store,
        orchestrator=a.orchestrator,
        advertise=a.advertise,
        heartbeat_s=a.heartbeat,
        drain_on_stop_s=a.drain_on_stop,
        gateway_forward=a.gateway_forward,
        gateway_port=a.gateway_port,
        registry_auth_file=a.registry_auth_file,
        registry_certs=a.registry_certs,
        insecure_registries=tuple(a.insecure_registry),
        tls=TlsFiles(a.tls_ca, a.tls_cert, a.tls_key) if all(tls_files) else None,
        join=JoinSettings(a.join, a.join_token_file, a.tls_ca) if a.join else None,
    )


def _path(value: str) -> Path | None:
    return Path(value) if value else None


def _watch_parent(stop: threading.Event) -> None:
    parent = os.getppid()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            logging.getLogger(__name__).warning("the process that started this agent is gone; stopping")
            stop.set()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    exit_with_parent = "--exit-with-parent" in (argv if argv is not None else sys.argv[1:])
    settings = settings_from_args(argv)
    try:
        if settings.join is not None:
            settings = replace(settings, tls=joined(settings.node, settings.root, settings.join))
        node = Node(settings)
        node.warm()
        server, port = serve(node, settings.listen, settings.tls)
    except AgentError as exc:
        sys.exit(f"stasis-agent: {exc}")
    set_aside_startup_objects()  # a full collection no longer lands in a restore (snapshots._collector)
    address = join_host_port(host_of(settings.listen, "--listen"), port)
    print(f"stasis-agent node={settings.node} listening on {address}", flush=True)
    forwarder = None
    if settings.gateway_forward:
        try:
            target = parse_target(settings.gateway_forward)
            # With this node's certificate the relay speaks TLS, as the node it names.
            forwarder = Forwarder((GATEWAY_IP, settings.gateway_port), target, tls=settings.tls).start()
        except ValueError as exc:
            sys.exit(f"stasis-agent: {exc}")
        print(
            f"relaying {GATEWAY_IP}:{settings.gateway_port} to the gateway at {settings.gateway_forward}"
            f"{' over TLS' if settings.tls else ''}",
            flush=True,
        )
    renewal = None
    if settings.join is not None and settings.tls is not None:
        renewal = Renewal(settings.node, settings.tls, settings.join).start()
    registration = None
    if settings.orchestrator:
        orchestrators = [o.strip() for o in settings.orchestrator.split(",") if o.strip()]
        registration = Registration(node, orchestrators, settings.advertise or address)
        registration.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if exit_with_parent:
        threading.Thread(target=_watch_parent, args=(stop,), daemon=True).start()
    stop.wait()
    if registration and settings.drain_on_stop_s > 0:
        registration.leave(settings.drain_on_stop_s)
    # Sandboxes still here keep running: a restarted agent picks them up from its records.
    if registration:
        registration.stop()
    if renewal:
        renewal.stop()
    if forwarder:
        forwarder.stop()
    server.stop(grace=1).wait()
    node.close()


if __name__ == "__main__":
    main()
