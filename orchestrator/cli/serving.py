"""`stasis up` and `stasis server`: the commands that run Stasis rather than call it. They
import the whole control plane; the other commands need only the client."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from orchestrator.domain import InvalidArgument
from protos.shared.tls import TlsFiles


def model_settings(a: argparse.Namespace, *, reference_model: bool) -> dict[str, Any]:
    """The gateway's model settings from the flags: the renderer (qwen3 over the reference
    model's tokenizer by default when `stasis up` serves the reference model), its options, the
    upstream's token route and the metrics port."""
    name = {"default": "qwen3" if reference_model else "", "none": ""}.get(a.renderer, a.renderer)
    tokenizer = a.tokenizer
    if tokenizer == "reference" or (name and not tokenizer and reference_model):
        from orchestrator.reference_model import TOKENIZER_DIR

        tokenizer = str(TOKENIZER_DIR)
    options = []
    for option in a.renderer_option:
        key, eq, value = option.partition("=")
        if not eq or not key:
            raise ValueError(f"--renderer-option: {option!r} is not KEY=VALUE")
        try:
            options.append((key, json.loads(value)))
        except ValueError:
            options.append((key, value))
    return {"renderer": name, "tokenizer": tokenizer if name else "", "renderer_options": tuple(options),
            "upstream_api": a.upstream_api, "metrics_listen": a.gateway_metrics_listen}  # fmt: skip


def up(a: argparse.Namespace, out: Any) -> int:
    """`stasis up`: a local stack in the foreground."""
    from orchestrator.cli.local import LocalSettings, run_foreground

    settings = LocalSettings(
        state_dir=Path(a.state_dir),
        nodes=a.nodes,
        listen=a.listen,
        slots=a.slots,
        backend=a.backend,
        upstream=a.upstream,
        gateway_port=a.gateway_port,
        registry_auth_file=Path(a.registry_auth_file) if a.registry_auth_file else None,
        registry_certs=Path(a.registry_certs) if a.registry_certs else None,
        insecure_registries=tuple(a.insecure_registry),
        secure=not a.insecure,
        model=model_settings(a, reference_model=not a.upstream),
        address_pool=a.address_pool,
    )
    return run_foreground(settings, out)


def orchestrator_certificate(a: argparse.Namespace) -> TlsFiles:
    """The certificate given, or one issued from the CA's key (`--tls-ca-key`) into the state
    dir for the names `--tls-hosts` lists, and kept while it is current."""
    from orchestrator.cli.pki import ClusterPki

    if a.tls_cert:
        return TlsFiles(Path(a.tls_ca), Path(a.tls_cert), Path(a.tls_key))
    hosts = tuple(h.strip() for h in a.tls_hosts.split(",") if h.strip())
    try:
        return ClusterPki(Path(a.state_dir) / "pki", (Path(a.tls_ca), Path(a.tls_ca_key))).orchestrator(hosts)
    except (OSError, ValueError) as exc:
        raise InvalidArgument("--tls-ca-key", f"cannot issue the orchestrator's certificate: {exc}") from None


def server(a: argparse.Namespace, out: Any) -> int:
    """`stasis server`: the orchestrator, until SIGINT or SIGTERM, or until its lease lapses."""
    from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings
    from orchestrator.control import ControlSettings
    from orchestrator.gateway import GatewaySettings
    from snapshots import set_aside_startup_objects

    issues_its_own = bool(a.tls_ca_key) and not (a.tls_cert or a.tls_key)
    given = {
        "--tls-ca": a.tls_ca,
        **({} if issues_its_own else {"--tls-cert": a.tls_cert, "--tls-key": a.tls_key}),
        "--tokens-file": a.tokens_file,
    }
    missing = [flag for flag, value in given.items() if not value]
    if a.insecure and (len(missing) < len(given) or a.tls_ca_key or a.join_service_account):
        raise InvalidArgument(
            "--insecure",
            "excludes --tls-ca, --tls-cert, --tls-key, --tokens-file, --tls-ca-key and --join-service-account",
        )
    if not a.insecure and missing:
        raise InvalidArgument(
            missing[0],
            "is required: the orchestrator serves TLS with its certificate from the cluster CA and "
            "checks bearer tokens (or give --insecure to trust every caller)",
        )
    if a.node_certificate_hours <= 0:
        raise InvalidArgument("--node-certificate-hours", "must be more than 0")
    auth = (
        None
        if a.insecure
        else AuthSettings(
            tls=orchestrator_certificate(a),
            tokens_file=Path(a.tokens_file),
            cluster_listen=a.cluster_listen,
            ca_key=Path(a.tls_ca_key) if a.tls_ca_key else None,
            join_service_account=a.join_service_account,
            node_certificate_s=a.node_certificate_hours * 3600,
        )
    )
    orchestrator = Orchestrator(
        OrchestratorSettings(
            state_dir=Path(a.state_dir),
            database_url=a.database_url,
            listen=a.listen,
            health_listen=a.health_listen,
            snapshot_store=a.snapshot_store,
            import_registry=a.import_registry,
            auth=auth,
            control=ControlSettings(
                node_lost_after_s=a.node_lost_after,
                address_pool=a.address_pool,
                gc_keep_last=a.gc_keep_last,
                default_time_slice_s=a.default_time_slice,
                default_priority=a.default_priority,
                kube_watch=a.kube_watch,
            ),
            gateway=GatewaySettings(
                listen=a.gateway_listen,
                port=a.gateway_port,
                # Nodes relay it to their sandboxes: each with its certificate, over TLS.
                tls=auth.tls if auth is not None else None,
                upstream=a.upstream,
                upstream_api_key=a.upstream_api_key,
                **model_settings(a, reference_model=False),
            ),
        )
    ).start()
    set_aside_startup_objects()  # a full collection walks only what the server makes later
    print(f"stasis server listening on {orchestrator.address}", file=out, flush=True)
    if auth is not None:
        print(f"nodes register on {orchestrator.cluster_address}", file=out, flush=True)
    if not orchestrator.leading:
        print("standing by: another orchestrator leads", file=out, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0) and not orchestrator.lost.is_set():
        pass
    orchestrator.stop()
    if orchestrator.lost.is_set():
        # Whatever its control loop had in flight was cut off by the fence: a fresh start
        # (its supervisor's restart) stands by and settles nothing twice.
        print("stasis server: the leadership lease lapsed; exiting", file=sys.stderr, flush=True)
        return 1
    return 0
