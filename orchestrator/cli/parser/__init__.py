"""The `stasis` command line: every command, flag and default, each explained in its --help with
examples, as kubectl's are. Server flags default to $STASIS_*."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli.parser._cluster import add_cluster_commands
from orchestrator.cli.parser._episodes import add_episode_commands
from orchestrator.cli.parser._helptext import examples
from orchestrator.cli.parser._servers import SERVING, add_server_commands
from orchestrator.client import DEFAULT_ADDR

__all__ = ["PLUGIN", "PROG", "invoked_as", "parser"]

PROG = "stasis"
PLUGIN = "kubectl-stasis"
"""The same program installed as kubectl's plugin: kubectl runs it for `kubectl stasis`."""


def invoked_as(argv0: str) -> str:
    """The program as its user typed it: `kubectl stasis` when kubectl ran it as its plugin."""
    return "kubectl stasis" if Path(argv0).name == PLUGIN else PROG


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line; `prog` names it in usage lines and errors."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Stasis: snapshotting sandboxes for preemptible agent rollouts.\n\n"
        "Also installed as the kubectl plugin `kubectl stasis`. "
        f"`{prog} COMMAND --help` explains a command, with examples.",
        epilog=examples(
            ("Run a local Stasis in one shell", "stasis up"),
            ("In another, submit an episode", "stasis submit -f episode.yaml"),
            (
                "List the episodes of the Stasis release in the Kubernetes namespace rl",
                "kubectl stasis get -n rl",
            ),
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection_flags(p, defaults=True)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log at INFO rather than WARNING (`up` and `server` always log at INFO)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_server_commands(sub)
    add_episode_commands(sub)
    add_cluster_commands(sub)
    # As with kubectl, where to connect may also follow the command (`kubectl stasis get -n NS`).
    for name, command in sub.choices.items():
        if name not in SERVING:
            for leaf in _leaves(command):
                _connection_flags(leaf, defaults=False, short_namespace=name not in COUNTED)
    return p


COUNTED = ("submit", "fork", "task")
"""The commands whose -n is a count of episodes, not a namespace."""


def _connection_flags(p: argparse.ArgumentParser, *, defaults: bool, short_namespace: bool = True) -> None:
    """Where a client connects, and how long it retries. A command's own copy of a flag leaves
    the value given before the command, or the default, unless it is given after it. After
    `submit`, `fork` and `task run`, -n is its count (`stasis submit -n 8`), so the namespace is --namespace
    alone."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument(
        "--addr",
        default=default(None),
        metavar="HOST:PORT",
        help=f"orchestrator address (default: $STASIS_ADDR or {DEFAULT_ADDR})",
    )
    p.add_argument(
        "--context",
        default=default(None),
        metavar="NAME",
        help="context of the client config (default: $STASIS_CONTEXT or current-context)",
    )
    p.add_argument(
        "--config",
        default=default(None),
        metavar="FILE",
        help="client config file (default: $STASIS_CONFIG or ~/.stasis/config)",
    )
    p.add_argument(
        *(("-n", "--namespace") if short_namespace else ("--namespace",)),
        default=default(""),
        metavar="NAMESPACE",
        help="find the orchestrator of the Stasis release in this Kubernetes namespace and reach it "
        "through a port-forward (the default of `kubectl stasis` with no --addr or --context: the "
        "kube context's namespace)",
    )
    p.add_argument(
        "--kube-context",
        default=default(""),
        metavar="NAME",
        help="Kubernetes context to find Stasis in (default: the kubeconfig's current one)",
    )
    p.add_argument(
        "--retry-for",
        type=float,
        default=default(10.0),
        metavar="SECONDS",
        help="retry this long while the orchestrator is unreachable (default: 10)",
    )


def _leaves(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that take a command's own flags: p, or those of its subcommands."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [p]
    return [leaf for a in subs for child in a.choices.values() for leaf in _leaves(child)]
