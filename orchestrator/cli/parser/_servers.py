"""The commands that run Stasis: `up` (a whole Stasis on this machine), `server` (the
orchestrator alone, in a cluster) and `state migrate` (a server's state into PostgreSQL)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from orchestrator.cli.parser._helptext import Subparsers, command
from orchestrator.client import DEFAULT_ADDR
from protos.shared.tls import ORCHESTRATOR

SERVING = ("up", "server", "state")
"""Commands that take no client connection flags after them: they serve, or work on a server's files."""


def add_server_commands(sub: Subparsers) -> None:
    up = command(
        sub,
        "up",
        "run a local Stasis in the foreground (orchestrator + node agents)",
        ("A Stasis on this machine, with the reference model", "stasis up"),
        (
            "A second stack beside the first: its own state dir, API port and gateway port",
            "stasis up --state-dir /var/lib/stasis/two --listen 127.0.0.1:7080 --gateway-port 8081",
        ),
        (
            "Four nodes of four slots, the gateway in front of a vLLM server",
            "stasis up --nodes 4 --slots 4 --upstream http://127.0.0.1:8000/v1 --renderer qwen3 "
            "--tokenizer /models/Qwen3-8B",
        ),
        about="The orchestrator with its SQLite state and a local snapshot store in --state-dir, "
        "--nodes node agent processes, an image registry on loopback, the reference model (unless "
        "--upstream) and the gateway on 169.254.1.1. Prints its address when ready; Ctrl-C stops "
        "it, and running sandboxes stay for the next `stasis up` with the same --state-dir.",
    )
    up.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        default=2,
        help="node agent processes, named node-1, node-2, ... (default %(default)s)",
    )
    up.add_argument(
        "--state-dir",
        default="/var/lib/stasis/local",
        metavar="DIR",
        help="where the stack keeps everything (state.db, snapshots/, nodes/, pki/, its client config); "
        "another DIR is another stack (default %(default)s)",
    )
    up.add_argument(
        "--listen",
        default=DEFAULT_ADDR,
        metavar="HOST:PORT",
        help="the orchestrator's public API; each stack on a host needs its own (default %(default)s)",
    )
    up.add_argument(
        "--slots",
        type=int,
        default=2,
        metavar="N",
        help="sandboxes each node runs at once (default %(default)s)",
    )
    up.add_argument(
        "--backend",
        choices=("runc", "docker"),
        default="runc",
        help="how nodes run sandboxes: runc (no daemon in the checkpoint path) or docker (the Docker "
        "Engine on this host) (default %(default)s)",
    )
    up.add_argument(
        "--upstream",
        default="",
        metavar="URL",
        help="OpenAI-compatible model server, up to and including /v1; empty starts the reference model "
        "(default: empty)",
    )
    up.add_argument(
        "--registry-auth-file",
        default=os.environ.get("REGISTRY_AUTH_FILE") or _docker_config(),
        metavar="FILE",
        help="docker config.json with the credentials of harness image registries, for the agents only "
        "(default: $REGISTRY_AUTH_FILE, else ~/.docker/config.json if there is one)",
    )
    up.add_argument(
        "--registry-certs",
        default="",
        metavar="DIR",
        help="directory of <host[:port]>/ca.crt for registries with private CAs; empty: none",
    )
    up.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a registry the agents reach over plain HTTP; repeatable (loopback ones always are)",
    )
    up.add_argument(
        "--gateway-port",
        type=int,
        metavar="PORT",
        default=8080,
        help="port of the gateway on 169.254.1.1; 0 picks a free one (default %(default)s)",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no tokens: anyone who reaches a port may call it (development only)",
    )
    up.add_argument(
        "--address-pool",
        default="",
        metavar="CIDR",
        help="sandbox addresses, disjoint from other stacks' on this host "
        "(default: the pool claimed before, else a free /20 of 10.200.0.0/16)",
    )
    _model_flags(up, lambda _, default: default, local=True)

    env = os.environ.get
    srv = command(
        sub,
        "server",
        "run the orchestrator alone (cluster mode); flags default to $STASIS_*",
        (
            "An orchestrator for development: plaintext, no tokens",
            "stasis server --insecure --state-dir /tmp/stasis --gateway-listen 0.0.0.0:8080",
        ),
        (
            "A secured orchestrator that issues its own certificate and those of joining nodes",
            "stasis server --tls-ca ca.crt --tls-ca-key ca.key --tls-hosts stasis.example,10.0.0.5 "
            "--tokens-file tokens.yaml --join-service-account stasis:stasis-agent",
        ),
        (
            "Its state in PostgreSQL (prefer $STASIS_DATABASE_URL: flags show in ps)",
            "stasis server --tls-ca ca.crt --tls-cert orchestrator.crt --tls-key orchestrator.key "
            "--tokens-file tokens.yaml --database-url postgresql://stasis@db.example:5432/stasis",
        ),
        about="The public API takes TLS and bearer tokens; node agents register on the mutual-TLS "
        "--cluster-listen. Give --tls-ca with --tls-cert and --tls-key (or --tls-ca-key and "
        "--tls-hosts) and --tokens-file, or --insecure.",
    )
    srv.add_argument(
        "--listen",
        default=env("STASIS_LISTEN", "0.0.0.0:7070"),
        metavar="HOST:PORT",
        help="the public gRPC API (default %(default)s; $STASIS_LISTEN sets it)",
    )
    srv.add_argument(
        "--health-listen",
        default=env("STASIS_HEALTH_LISTEN", ""),
        metavar="HOST:PORT",
        help="plaintext gRPC health checking alone, for probes that cannot speak TLS; "
        "stasis.v1.Stasis is SERVING only on the leader; empty: none (default: $STASIS_HEALTH_LISTEN)",
    )
    _state_flags(
        srv,
        "the SQLite state (state.db), the default snapshot store and issued certificates",
        "to keep episodes, events and nodes in (default: $STASIS_DATABASE_URL, else SQLite in --state-dir)",
    )
    srv.add_argument(
        "--snapshot-store",
        default=env("STASIS_SNAPSHOT_STORE", ""),
        metavar="URL",
        help="snapshot store shared with every node, file:///DIR or s3://BUCKET/PREFIX; "
        "empty: file://STATE_DIR/snapshots (default: $STASIS_SNAPSHOT_STORE)",
    )
    srv.add_argument(
        "--import-registry",
        default=env("STASIS_IMPORT_REGISTRY", ""),
        metavar="HOST:PORT",
        help="the registry `stasis image import` pushes local sources to; empty: none "
        "(default: $STASIS_IMPORT_REGISTRY)",
    )
    srv.add_argument(
        "--node-lost-after",
        type=float,
        default=float(env("STASIS_NODE_LOST_AFTER", "10")),
        metavar="SECONDS",
        help="a node silent this long is lost, and its episodes go back to their last snapshot "
        "(default %(default)s; $STASIS_NODE_LOST_AFTER sets it)",
    )
    srv.add_argument(
        "--address-pool",
        default=env("STASIS_ADDRESS_POOL", "10.200.0.0/16"),
        metavar="CIDR",
        help="sandbox addresses; each live episode holds one on every node it runs on "
        "(default %(default)s; $STASIS_ADDRESS_POOL sets it)",
    )
    srv.add_argument(
        "--gateway-listen",
        default=env("STASIS_GATEWAY_LISTEN", ""),
        metavar="HOST:PORT",
        help="where the gateway takes the model calls nodes relay from their sandboxes (TLS unless "
        "--insecure); empty: no gateway, and sandboxes get no model endpoint "
        "(default: $STASIS_GATEWAY_LISTEN)",
    )
    srv.add_argument(
        "--gateway-port",
        type=int,
        metavar="PORT",
        default=int(env("STASIS_GATEWAY_PORT", "8080")),
        help="port of the gateway as sandboxes see it, on 169.254.1.1 "
        "(default %(default)s; $STASIS_GATEWAY_PORT sets it)",
    )
    srv.add_argument(
        "--upstream",
        default=env("STASIS_UPSTREAM", ""),
        metavar="URL",
        help="OpenAI-compatible model server the gateway forwards to, up to and including /v1; "
        "empty: none (default: $STASIS_UPSTREAM)",
    )
    _model_flags(srv, env, local=False)
    srv.add_argument(
        "--upstream-api-key",
        default=env("STASIS_UPSTREAM_API_KEY", ""),
        metavar="KEY",
        help="bearer token for the upstream model server; empty: none "
        "(default: $STASIS_UPSTREAM_API_KEY); sandboxes never see it",
    )
    srv.add_argument(
        "--gc-keep-last",
        type=int,
        default=int(env("STASIS_GC_KEEP_LAST", "3")),
        metavar="N",
        help="snapshots kept per live episode, the latest always among them; older ones are collected "
        "(default %(default)s; $STASIS_GC_KEEP_LAST sets it)",
    )
    srv.add_argument(
        "--default-time-slice",
        type=float,
        default=float(env("STASIS_DEFAULT_TIME_SLICE_SECONDS", "0")),
        metavar="SECONDS",
        help="time slice of episodes whose spec gives none: checkpoint and requeue after this long "
        "while others wait; 0: never (default %(default)s; $STASIS_DEFAULT_TIME_SLICE_SECONDS sets it)",
    )
    srv.add_argument(
        "--default-priority",
        type=int,
        metavar="PRIORITY",
        default=int(env("STASIS_DEFAULT_PRIORITY", "0")),
        help="priority of episodes whose spec gives none; higher runs first and may preempt lower "
        "(default %(default)s; $STASIS_DEFAULT_PRIORITY sets it)",
    )
    srv.add_argument(
        "--tls-ca",
        default=env("STASIS_TLS_CA", ""),
        metavar="FILE",
        help="cluster CA certificate (default: $STASIS_TLS_CA)",
    )
    srv.add_argument(
        "--tls-cert",
        default=env("STASIS_TLS_CERT", ""),
        metavar="FILE",
        help=f"the orchestrator's certificate, naming {ORCHESTRATOR} (default: $STASIS_TLS_CERT)",
    )
    srv.add_argument(
        "--tls-key",
        default=env("STASIS_TLS_KEY", ""),
        metavar="FILE",
        help="its private key (default: $STASIS_TLS_KEY)",
    )
    srv.add_argument(
        "--tls-ca-key",
        default=env("STASIS_TLS_CA_KEY", ""),
        metavar="FILE",
        help="the cluster CA's key: sign certificates for nodes that prove who they are; empty: none "
        "(default: $STASIS_TLS_CA_KEY)",
    )
    srv.add_argument(
        "--tls-hosts",
        default=env("STASIS_TLS_HOSTS", ""),
        metavar="NAME,...",
        help="with --tls-ca-key and no --tls-cert: names and addresses, comma-separated, of the "
        "certificate it issues itself (default: $STASIS_TLS_HOSTS)",
    )
    srv.add_argument(
        "--join-service-account",
        default=env("STASIS_JOIN_SERVICE_ACCOUNT", ""),
        metavar="NAMESPACE:NAME",
        help="the agents' Kubernetes service account, whose pod tokens prove a node; empty: nodes "
        "cannot join (default: $STASIS_JOIN_SERVICE_ACCOUNT)",
    )
    srv.add_argument(
        "--node-certificate-hours",
        type=float,
        default=float(env("STASIS_NODE_CERTIFICATE_HOURS", "24")),
        metavar="HOURS",
        help="how long a joining node's certificate lasts; the node renews it two thirds of the way "
        "through (default %(default)s; $STASIS_NODE_CERTIFICATE_HOURS sets it)",
    )
    srv.add_argument(
        "--tokens-file",
        default=env("STASIS_TOKENS_FILE", ""),
        metavar="FILE",
        help="bearer tokens and their roles (`stasis token create`); required unless --insecure "
        "(default: $STASIS_TOKENS_FILE)",
    )
    srv.add_argument(
        "--cluster-listen",
        default=env("STASIS_CLUSTER_LISTEN", "0.0.0.0:7071"),
        metavar="HOST:PORT",
        help="mutual-TLS address where nodes register (default %(default)s; $STASIS_CLUSTER_LISTEN sets it)",
    )
    srv.add_argument(
        "--insecure",
        action="store_true",
        default=bool(env("STASIS_INSECURE")),
        help="plaintext and no tokens on one port (development only; default: on if $STASIS_INSECURE is set)",
    )
    srv.add_argument(
        "--kube-watch",
        action=argparse.BooleanOptionalAction,
        default=bool(env("KUBERNETES_SERVICE_HOST")),
        help="drain nodes Kubernetes is reclaiming (default: on inside a cluster)",
    )

    st = command(
        sub,
        "state",
        "the orchestrator's own state: move it from SQLite to PostgreSQL",
        (
            "Copy a stopped orchestrator's state into PostgreSQL",
            "STASIS_DATABASE_URL=postgresql://stasis@db.example/stasis stasis state migrate --state-dir /var/lib/stasis",
        ),
    )
    st_sub = st.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    sm = command(
        st_sub,
        "migrate",
        "copy --state-dir's SQLite state (episodes, events, snapshots, nodes, images, logs, request ids, "
        "the trajectory ledger) into a PostgreSQL database no orchestrator has used; stop the orchestrator first",
        (
            "Copy a stopped orchestrator's state into PostgreSQL",
            "STASIS_DATABASE_URL=postgresql://stasis@db.example/stasis stasis state migrate --state-dir /var/lib/stasis",
        ),
        about="One transaction: either every row is copied or none. Prints the rows per table.",
    )
    _state_flags(
        sm,
        "the state to copy (its state.db)",
        "to copy into (default: $STASIS_DATABASE_URL)",
    )


def _docker_config() -> str:
    path = Path.home() / ".docker" / "config.json"
    return str(path) if path.is_file() else ""


def _model_flags(p: argparse.ArgumentParser, env: Callable[[str, str], str], *, local: bool) -> None:
    """How the gateway speaks to the model server: token ids through the model's chat template
    (a renderer and its tokenizer), or text."""

    def default(variable: str, otherwise: str) -> str:
        return f"(default: {otherwise})" if local else f"(default: ${variable}, else {otherwise})"

    p.add_argument(
        "--renderer",
        default=env("STASIS_RENDERER", "" if not local else "default"),
        metavar="NAME",
        help="the model's chat template as `renderers` names it (qwen3, qwen3.5, glm-4.5, kimi-k2, ...): "
        "prompts go upstream as token ids and sampled ids are parsed back; `none` sends text "
        + (
            "(default: qwen3 for the reference model, none for --upstream)"
            if local
            else "(default: $STASIS_RENDERER, else none)"
        ),
    )
    p.add_argument(
        "--tokenizer",
        default=env("STASIS_TOKENIZER", ""),
        metavar="DIR",
        help="the model's tokenizer directory (tokenizer.json); `reference` for the reference model's "
        + default("STASIS_TOKENIZER", "the reference model's when it serves and a renderer is named"),
    )
    p.add_argument(
        "--renderer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a renderer setting, VALUE in JSON (e.g. enable_thinking=false); repeatable (default: none)",
    )
    p.add_argument(
        "--upstream-api",
        choices=("vllm", "sglang"),
        default=env("STASIS_UPSTREAM_API", "vllm"),
        help="how the model server takes token ids: vllm (/v1/completions) or sglang (/generate) "
        + default("STASIS_UPSTREAM_API", "vllm"),
    )
    p.add_argument(
        "--gateway-metrics-listen",
        default=env("STASIS_GATEWAY_METRICS_LISTEN", ""),
        metavar="HOST:PORT",
        help="where the gateway serves /metrics (Prometheus text); empty serves none "
        + default("STASIS_GATEWAY_METRICS_LISTEN", "none"),
    )


def _state_flags(p: argparse.ArgumentParser, state_dir: str, database: str) -> None:
    """Where an orchestrator keeps its state: --state-dir, and --database-url for PostgreSQL."""
    p.add_argument(
        "--state-dir",
        default=os.environ.get("STASIS_STATE_DIR", "/var/lib/stasis"),
        metavar="DIR",
        help=f"{state_dir} (default %(default)s; $STASIS_STATE_DIR sets it)",
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("STASIS_DATABASE_URL", ""),
        metavar="URL",
        help=f"postgresql://USER:PASSWORD@HOST:PORT/DATABASE {database}; prefer the variable, as flags show in ps",
    )
