"""The `stasis` command line: every command, flag and default. Server flags default to $STASIS_*."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from orchestrator.cli.datasets import moment
from orchestrator.client import DEFAULT_ADDR
from protos.shared.tls import ORCHESTRATOR

PROG = "stasis"


def _docker_config() -> str:
    path = Path.home() / ".docker" / "config.json"
    return str(path) if path.is_file() else ""


def _model_flags(p: argparse.ArgumentParser, env: Callable[[str, str], str], *, local: bool) -> None:
    """How the gateway speaks to the model server: token ids through the model's chat template
    (a renderer and its tokenizer), or text."""
    p.add_argument(
        "--renderer",
        default=env("STASIS_RENDERER", "" if not local else "default"),
        help="the model's chat template as `renderers` names it (qwen3, qwen3.5, glm-4.5, kimi-k2, ...): "
        "prompts go upstream as token ids and sampled ids are parsed back; `none` sends text"
        + (
            " (default: qwen3 for the reference model, none for --upstream)"
            if local
            else " ($STASIS_RENDERER)"
        ),
    )
    p.add_argument(
        "--tokenizer",
        default=env("STASIS_TOKENIZER", ""),
        help="the model's tokenizer directory (tokenizer.json); `reference` for the reference model's",
    )
    p.add_argument(
        "--renderer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a renderer setting, VALUE in JSON (e.g. enable_thinking=false); repeatable",
    )
    p.add_argument(
        "--upstream-api",
        choices=("vllm", "sglang"),
        default=env("STASIS_UPSTREAM_API", "vllm"),
        help="how the model server takes token ids: vllm (/v1/completions) or sglang (/generate)",
    )
    p.add_argument(
        "--gateway-metrics-listen",
        default=env("STASIS_GATEWAY_METRICS_LISTEN", ""),
        help="host:port of the gateway's /metrics (Prometheus text); empty serves none",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Stasis: snapshotting sandboxes for preemptible agent rollouts"
    )
    _connection_flags(p, defaults=True)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run a local Stasis in the foreground (orchestrator + node agents)")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--state-dir", default="/var/lib/stasis/local")
    up.add_argument("--listen", default=DEFAULT_ADDR)
    up.add_argument("--slots", type=int, default=2, help="sandboxes per node")
    up.add_argument("--backend", choices=("runc", "docker"), default="runc")
    up.add_argument(
        "--upstream", default="", help="OpenAI-compatible model server (default: the reference model)"
    )
    up.add_argument(
        "--registry-auth-file",
        default=os.environ.get("REGISTRY_AUTH_FILE") or _docker_config(),
        help="docker config.json with the credentials of harness image registries, for the agents only "
        "(default: $REGISTRY_AUTH_FILE, else ~/.docker/config.json if there is one)",
    )
    up.add_argument("--registry-certs", default="", help="directory of <host[:port]>/ca.crt for private CAs")
    up.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        help="host[:port] reached over plain HTTP (repeatable)",
    )
    up.add_argument(
        "--gateway-port",
        type=int,
        default=8080,
        help="port of the gateway on 169.254.1.1 (0 picks a free one)",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no tokens: anyone who reaches a port may call it (development only)",
    )
    up.add_argument(
        "--address-pool",
        default="",
        help="sandbox addresses (CIDR), disjoint from other stacks' on this host "
        "(default: the pool claimed before, else a free /20 of 10.200.0.0/16)",
    )
    _model_flags(up, lambda _, default: default, local=True)

    env = os.environ.get
    srv = sub.add_parser(
        "server", help="run the orchestrator alone (cluster mode); flags default to $STASIS_*"
    )
    srv.add_argument("--listen", default=env("STASIS_LISTEN", "0.0.0.0:7070"))
    srv.add_argument(
        "--health-listen",
        default=env("STASIS_HEALTH_LISTEN", ""),
        help="plaintext gRPC health checking alone, for probes that cannot speak TLS; "
        "stasis.v1.Stasis is SERVING only on the leader",
    )
    _state_flags(
        srv,
        "to keep episodes, events and nodes in (default: $STASIS_DATABASE_URL, else SQLite in --state-dir)",
    )
    srv.add_argument("--snapshot-store", default=env("STASIS_SNAPSHOT_STORE", ""))
    srv.add_argument(
        "--import-registry",
        default=env("STASIS_IMPORT_REGISTRY", ""),
        help="host:port of the registry `stasis image import` pushes local sources to",
    )
    srv.add_argument("--node-lost-after", type=float, default=float(env("STASIS_NODE_LOST_AFTER", "10")))
    srv.add_argument(
        "--address-pool",
        default=env("STASIS_ADDRESS_POOL", "10.200.0.0/16"),
        help="sandbox addresses (CIDR); each live episode holds one on every node it runs on",
    )
    srv.add_argument("--gateway-listen", default=env("STASIS_GATEWAY_LISTEN", ""))
    srv.add_argument("--gateway-port", type=int, default=int(env("STASIS_GATEWAY_PORT", "8080")))
    srv.add_argument("--upstream", default=env("STASIS_UPSTREAM", ""))
    _model_flags(srv, env, local=False)
    srv.add_argument(
        "--upstream-api-key",
        default=env("STASIS_UPSTREAM_API_KEY", ""),
        help="bearer token for the upstream model server (default: $STASIS_UPSTREAM_API_KEY); sandboxes never see it",
    )
    srv.add_argument("--gc-keep-last", type=int, default=int(env("STASIS_GC_KEEP_LAST", "3")))
    srv.add_argument(
        "--default-time-slice", type=float, default=float(env("STASIS_DEFAULT_TIME_SLICE_SECONDS", "0"))
    )
    srv.add_argument("--default-priority", type=int, default=int(env("STASIS_DEFAULT_PRIORITY", "0")))
    srv.add_argument("--tls-ca", default=env("STASIS_TLS_CA", ""), help="cluster CA certificate")
    srv.add_argument(
        "--tls-cert",
        default=env("STASIS_TLS_CERT", ""),
        help=f"the orchestrator's certificate (names {ORCHESTRATOR})",
    )
    srv.add_argument("--tls-key", default=env("STASIS_TLS_KEY", ""), help="its private key")
    srv.add_argument(
        "--tls-ca-key",
        default=env("STASIS_TLS_CA_KEY", ""),
        help="the cluster CA's key: sign certificates for nodes that prove who they are",
    )
    srv.add_argument(
        "--tls-hosts",
        default=env("STASIS_TLS_HOSTS", ""),
        help="with --tls-ca-key and no --tls-cert: names and addresses, comma-separated, of the certificate it issues itself",
    )
    srv.add_argument(
        "--join-service-account",
        default=env("STASIS_JOIN_SERVICE_ACCOUNT", ""),
        help="NAMESPACE:NAME of the agents' Kubernetes service account, whose pod tokens prove a node",
    )
    srv.add_argument(
        "--node-certificate-hours",
        type=float,
        default=float(env("STASIS_NODE_CERTIFICATE_HOURS", "24")),
        help="how long a joining node's certificate lasts; the node renews it two thirds of the way through",
    )
    srv.add_argument(
        "--tokens-file",
        default=env("STASIS_TOKENS_FILE", ""),
        help="bearer tokens and their roles (`stasis token create`)",
    )
    srv.add_argument(
        "--cluster-listen",
        default=env("STASIS_CLUSTER_LISTEN", "0.0.0.0:7071"),
        help="mutual-TLS address where nodes register",
    )
    srv.add_argument(
        "--insecure",
        action="store_true",
        default=bool(env("STASIS_INSECURE")),
        help="plaintext and no tokens on one port (development only)",
    )
    srv.add_argument(
        "--kube-watch",
        action=argparse.BooleanOptionalAction,
        default=bool(env("KUBERNETES_SERVICE_HOST")),
        help="drain nodes Kubernetes is reclaiming (default: on inside a cluster)",
    )

    s = sub.add_parser("submit", help="submit an episode, or N of them, or a GRPO group; prints their ids")
    s.add_argument("-f", "--file", required=True, help="episode spec, YAML or JSON")
    s.add_argument(
        "--request-id", default="", help="makes retries of this submit idempotent (member i of N: ID/i)"
    )
    s.add_argument(
        "-n", "--count", type=_count, default=1,
        help="episodes of the spec, in one commit (after `submit`, -n is this; give a namespace as --namespace)",
    )  # fmt: skip
    s.add_argument("--group", default="", help="submit the N episodes as the members of this GRPO group")
    s.add_argument(
        "--task", default="", help="the group's task id (default: the spec file's name without extension)"
    )
    s.add_argument(
        "--max-staleness", type=int, default=None, help="the group's bound on policy versions a turn may lag"
    )

    gr = sub.add_parser("groups", help="GRPO groups: members final of N, and their rewards")
    gr.add_argument("id", nargs="?", default="")
    gr.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    g = sub.add_parser("get", help="list episodes, or show one")
    g.add_argument("id", nargs="?")
    g.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table")
    g.add_argument("--state", action="append", help="filter by state (repeatable)")
    g.add_argument("--node", help="filter by node")
    g.add_argument(
        "-l", "--selector", action="append", type=_label, help="filter by label KEY=VALUE (repeatable)"
    )

    w = sub.add_parser("wait", help="wait until an episode reaches a state")
    w.add_argument("id")
    w.add_argument("--for", dest="for_state", required=True, help="state, or several separated by commas")
    w.add_argument("--timeout", type=float, default=600)

    for name, text in (
        ("preempt", "checkpoint a running episode and hold it"),
        ("resume", "resume a preempted episode"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("id")
        if name == "preempt":
            c.add_argument("--reason", default="")
        else:
            c.add_argument("--node", default="", help="restore on this node")
        c.add_argument("--wait", action="store_true", help="wait until it is PREEMPTED / RUNNING")
        c.add_argument("--timeout", type=float, default=600)

    c = sub.add_parser("cancel", help="cancel an episode")
    c.add_argument("id")

    for name, text in (
        ("snapshots", "snapshot history with lineage"),
        ("events", "state changes and decisions"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("id")
        c.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    x = sub.add_parser(
        "export", help="write a snapshot as a container checkpoint archive (checkpointctl reads it)"
    )
    x.add_argument("snapshot_id")
    x.add_argument("-o", "--output", required=True, help="archive file to write")

    t = sub.add_parser("trajectory", help="recorded turns: token ids, behaviour log-probs, branches, reward")
    t.add_argument("id")
    t.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    ts = sub.add_parser("trajectories", help="finished episodes' trajectories as a dataset for a trainer")
    ts_sub = ts.add_subparsers(dest="trajectories_command", required=True, metavar="ACTION")
    tx = ts_sub.add_parser("export", help="write tree samples, per-call records or ATIF as Parquet or JSONL")
    tx.add_argument("-o", "--output", required=True, help="file to write (.parquet, or .jsonl)")
    tx.add_argument("--records", choices=("tree", "calls", "atif"), default="tree",
                    help="tree: at most --max-paths streams per tree with per-token weights; calls: one "
                    "row per model call with its parent, for trie packing; atif: one ATIF v1.8 trajectory")  # fmt: skip
    tx.add_argument("--format", choices=("parquet", "jsonl"), default="",
                    help="default: jsonl for a .jsonl file, else parquet")  # fmt: skip
    tx.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                    help="only episodes with this label; repeatable")  # fmt: skip
    tx.add_argument("--since", type=moment, default=None, metavar="TIME",
                    help="only episodes finished at or after TIME (epoch seconds, or ISO 8601, UTC unless it says)")  # fmt: skip
    tx.add_argument(
        "--until", type=moment, default=None, metavar="TIME", help="only episodes finished before TIME"
    )
    tx.add_argument("--group", default="", help="only the members of this GRPO group, in index order")
    tx.add_argument("--max-paths", type=int, default=5, help="streams kept per tree (tree records)")
    tx.add_argument("--keep-masked", action="store_true",
                    help="train on abandoned turns and turns whose delivery is uncertain too (flagged either way)")  # fmt: skip
    pol = sub.add_parser("policy", help="policy versions: publish a trainer's weight update")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    pp = pol_sub.add_parser(
        "publish",
        help="make VERSION the current policy version; turns whose model server names none record it "
        "from then on; versions only go up",
    )
    pp.add_argument("version", type=int, help="a positive integer above the version published now")

    n = sub.add_parser("nodes", help="list nodes")
    n.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    d = sub.add_parser("drain", help="move every episode off a node and keep new ones away")
    d.add_argument("node")
    d.add_argument("--wait", action="store_true")
    d.add_argument("--timeout", type=float, default=600)
    u = sub.add_parser("uncordon", help="let a drained node take episodes again")
    u.add_argument("node")

    lg = sub.add_parser("logs", help="a harness's output across all its runs, as kubectl logs")
    lg.add_argument("id")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the episode ends")
    lg.add_argument("--run", type=int, default=0, help="only this run (1 is the first); default all")

    im = sub.add_parser("image", help="images by name: import, ls, rm")
    im_sub = im.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    imp = im_sub.add_parser("import", help="make an image available to every node under NAME")
    imp.add_argument("name")
    imp.add_argument(
        "source",
        help="a directory (a root filesystem or an OCI layout), an OCI-layout or docker-archive "
        "tarball, docker://IMAGE from the local Docker engine, or a registry reference host/repo:tag",
    )
    ls = im_sub.add_parser("ls", help="name, digest, size and the nodes that cache each image")
    ls.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    rm = im_sub.add_parser("rm", help="remove an image name (episodes that use it keep their bytes)")
    rm.add_argument("name")

    tk = sub.add_parser("token", help="issue bearer tokens of the public API")
    tk_sub = tk.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    tc = tk_sub.add_parser("create", help="add a token to a tokens file and print it (shown only this once)")
    tc.add_argument("name", help="who holds it; events of the changes it asks for record this name")
    tc.add_argument("--role", required=True, choices=("viewer", "trainer", "operator"))
    tc.add_argument("--tokens-file", required=True, help="the file `stasis server --tokens-file` reads")

    st = sub.add_parser("state", help="the orchestrator's own state: move it from SQLite to PostgreSQL")
    st_sub = st.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    sm = st_sub.add_parser(
        "migrate",
        help="copy --state-dir's SQLite state (episodes, events, snapshots, nodes, images, logs, request ids, "
        "the trajectory ledger) into a PostgreSQL database no orchestrator has used; stop the orchestrator first",
    )
    _state_flags(sm, "to copy into (default: $STASIS_DATABASE_URL)")

    cf = sub.add_parser("config", help="the client config's contexts, as kubectl config")
    cf_sub = cf.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    sc = cf_sub.add_parser("set-context", help="add or replace a context and make it current")
    sc.add_argument("name")
    sc.add_argument("--server", required=True, help="HOST:PORT of the orchestrator's public API")
    sc.add_argument("--certificate-authority", default="", help="PEM file of the cluster CA")
    sc.add_argument("--tls-server-name", default="", help="the name the orchestrator's certificate carries")
    sc.add_argument("--token-file", default="", help="a file holding the bearer token")
    # As with kubectl, where to connect may also follow the command (`kubectl stasis get -n NS`).
    for name, command in sub.choices.items():
        if name not in ("up", "server", "state"):
            for leaf in _leaves(command):
                _connection_flags(leaf, defaults=False, short_namespace=name != "submit")
    return p


def _state_flags(p: argparse.ArgumentParser, database: str) -> None:
    """Where an orchestrator keeps its state: --state-dir, and --database-url for PostgreSQL."""
    p.add_argument("--state-dir", default=os.environ.get("STASIS_STATE_DIR", "/var/lib/stasis"))
    p.add_argument(
        "--database-url",
        default=os.environ.get("STASIS_DATABASE_URL", ""),
        help=f"postgresql://USER:PASSWORD@HOST:PORT/DATABASE {database}; prefer the variable, as flags show in ps",
    )


def _connection_flags(p: argparse.ArgumentParser, *, defaults: bool, short_namespace: bool = True) -> None:
    """Where a client connects, and how long it retries. A command's own copy of a flag leaves
    the value given before the command, or the default, unless it is given after it. After
    `submit`, -n is its count (`stasis submit -n 8`), so the namespace is --namespace alone."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument(
        "--addr",
        default=default(None),
        help=f"orchestrator address (default: $STASIS_ADDR or {DEFAULT_ADDR})",
    )
    p.add_argument(
        "--context",
        default=default(None),
        help="context of the client config (default: $STASIS_CONTEXT or current-context)",
    )
    p.add_argument(
        "--config",
        default=default(None),
        help="client config file (default: $STASIS_CONFIG or ~/.stasis/config)",
    )
    p.add_argument(
        *(("-n", "--namespace") if short_namespace else ("--namespace",)),
        default=default(""),
        help="find the orchestrator of the Stasis release in this Kubernetes namespace and reach it "
        "through a port-forward (the default of `kubectl stasis` with no --addr or --context: the "
        "kube context's namespace)",
    )
    p.add_argument(
        "--kube-context", default=default(""), help="Kubernetes context to find Stasis in (default: current)"
    )
    p.add_argument(
        "--retry-for",
        type=float,
        default=default(10.0),
        help="seconds to retry while the orchestrator is unreachable",
    )


def _leaves(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that take a command's own flags: p, or those of its subcommands."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [p]
    return [leaf for a in subs for child in a.choices.values() for leaf in _leaves(child)]


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of episodes (after `submit`, a namespace is --namespace)"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} episodes: give at least 1")
    return count


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value
