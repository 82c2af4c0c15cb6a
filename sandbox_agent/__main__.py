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


def settings_from_args(argv: list[str] | None = None) -> AgentSettings:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="stasis-agent", description="Stasis node agent")
    p.add_argument("--node", default=env("STASIS_NODE", ""), required=not env("STASIS_NODE"))
    p.add_argument("--root", type=Path, default=Path(env("STASIS_AGENT_ROOT", "/var/lib/stasis/agent")))
    p.add_argument(
        "--stack",
        default=env("STASIS_STACK", ""),
        help="the stack this node belongs to where several share a host (keys its cgroups, netns, "
        "veths and gateway allowances); [a-z0-9-], empty for the host's only stack",
    )
    p.add_argument("--image-cache", type=Path, default=None, help="image cache dir (default ROOT/images)")
    p.add_argument("--backend", choices=("runc", "docker"), default=env("STASIS_BACKEND", "runc"))
    p.add_argument("--listen", default=env("STASIS_AGENT_LISTEN", "127.0.0.1:0"))
    p.add_argument(
        "--base-image-tar", type=Path, default=Path(env("STASIS_BASE_IMAGE_TAR", str(DEFAULT_BASE_IMAGE_TAR)))
    )
    p.add_argument("--criu", default=env("STASIS_CRIU", "criu"))
    p.add_argument(
        "--eager-restore",
        action="store_true",
        default=bool(env("STASIS_EAGER_RESTORE")),
        help="fetch a snapshot's whole memory before restoring it (default: lazily, as the sandbox touches it)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path(env("STASIS_RUN_DIR", "/run/stasis")),
        help="where sandboxes' root filesystems are mounted; every directory on the way searchable",
    )
    p.add_argument(
        "--memory-dir",
        type=_path,
        default=_path(env("STASIS_MEMORY_DIR", "/dev/shm")),
        help="a tmpfs where lazy restores stage the snapshot's small files (empty: on disk)",
    )
    p.add_argument(
        "--userns-base",
        type=int,
        default=int(env("STASIS_USERNS_BASE", "100000")),
        help="host uid/gid of a sandbox's root (its 65536 ids follow); the same on every node; 0: none",
    )
    p.add_argument(
        "--allow-port",
        type=int,
        action="append",
        default=[],
        help="TCP port on 169.254.1.1 sandboxes may reach",
    )
    p.add_argument("--slots", type=int, default=int(env("STASIS_SLOTS", "4")))
    p.add_argument("--memory-mb", type=int, default=int(env("STASIS_MEMORY_MB", "16384")))
    p.add_argument(
        "--disk-mb",
        type=int,
        default=int(env("STASIS_DISK_MB", "0")),
        help="disk the node offers its sandboxes' layers and checkpoints, in MiB; 0: 90%% of what is free at start",
    )
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    p.add_argument(
        "--snapshot-store", default=env("STASIS_SNAPSHOT_STORE", ""), help="file:///dir or s3://bucket/prefix"
    )
    p.add_argument(
        "--orchestrator",
        default=env("STASIS_ORCHESTRATOR", ""),
        help="HOST:PORT to register with; several, comma-separated, for orchestrator replicas (the leader answers)",
    )
    p.add_argument(
        "--advertise", default=env("STASIS_ADVERTISE", ""), help="HOST:PORT the orchestrator dials"
    )
    p.add_argument("--heartbeat", type=float, default=float(env("STASIS_HEARTBEAT_S", "1.0")))
    p.add_argument(
        "--gateway-forward", default=env("STASIS_GATEWAY_FORWARD", ""), help="HOST:PORT of the gateway"
    )
    p.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process dies")
    p.add_argument(
        "--drain-on-stop",
        type=float,
        default=float(env("STASIS_DRAIN_ON_STOP_S", "0")),
        metavar="SECONDS",
        help="on SIGTERM, have the orchestrator drain this node and wait up to SECONDS for its sandboxes to move",
    )
    p.add_argument("--gateway-port", type=int, default=int(env("STASIS_GATEWAY_PORT", "8080")))
    p.add_argument(
        "--registry-auth-file",
        type=Path,
        default=_path(env("STASIS_REGISTRY_AUTH_FILE", "")),
        help="docker config.json with registry credentials",
    )
    p.add_argument(
        "--registry-certs",
        type=Path,
        default=_path(env("STASIS_REGISTRY_CERTS", "")),
        help="dir of <host[:port]>/ca.crt for registries with private CAs",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[r for r in env("STASIS_INSECURE_REGISTRIES", "").split(",") if r],
        help="host[:port] reached over plain HTTP (repeatable; loopback ones always are)",
    )
    p.add_argument(
        "--tls-ca", type=Path, default=_path(env("STASIS_TLS_CA", "")), help="cluster CA certificate"
    )
    p.add_argument(
        "--tls-cert", type=Path, default=_path(env("STASIS_TLS_CERT", "")), help="this node's certificate"
    )
    p.add_argument("--tls-key", type=Path, default=_path(env("STASIS_TLS_KEY", "")), help="its private key")
    p.add_argument(
        "--join",
        default=env("STASIS_JOIN", ""),
        help="HOST:PORT of the orchestrator's public API: get this node's certificate there (with --tls-ca and --join-token-file)",
    )
    p.add_argument(
        "--join-token-file",
        type=Path,
        default=_path(env("STASIS_JOIN_TOKEN_FILE", "")),
        help="this pod's Kubernetes service-account token (audience stasis), proving which node it is",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=bool(env("STASIS_INSECURE")),
        help="serve plaintext gRPC to anyone who reaches --listen (development only)",
    )
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
