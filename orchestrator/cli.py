"""`stasis` (also installed as the kubectl plugin `kubectl-stasis`): run, submit, inspect, preempt.

Errors print one line and exit 1; the server address comes from --addr or STASIS_ADDR.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.client import DEFAULT_ADDR, EpisodeInfo, StasisClient
from orchestrator.errors import StasisError, TemporaryError
from orchestrator.model import EpisodeState

PROG = "stasis"


def _age(since: float, now: float) -> str:
    if not since:
        return "-"
    s = max(0, int(now - since))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


def _table(rows: Sequence[Sequence[str]], out: Any) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _dump(data: Any, fmt: str, out: Any) -> None:
    if fmt == "yaml":
        yaml.safe_dump(data, out, sort_keys=False)
    else:
        json.dump(data, out, indent=2)
        print(file=out)


def _reward(e: EpisodeInfo) -> str:
    return "-" if e.reward is None else f"{e.reward:g}"


class Commands:
    def __init__(self, args: argparse.Namespace, out: Any = sys.stdout, err: Any = sys.stderr) -> None:
        self.args = args
        self.out = out
        self.err = err

    def client(self) -> StasisClient:
        return StasisClient(self.args.addr, retry_for_s=self.args.retry_for)

    def progress(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    # -- commands ---------------------------------------------------------------------------

    def up(self) -> int:
        from orchestrator.local import LocalSettings, run_foreground

        a = self.args
        settings = LocalSettings(
            state_dir=Path(a.state_dir),
            nodes=a.nodes,
            listen=a.listen,
            slots=a.slots,
            backend=a.backend,
            upstream=a.upstream,
        )
        return run_foreground(settings, self.out)

    def server(self) -> int:
        from orchestrator.server import Orchestrator
        from orchestrator.settings import OrchestratorSettings

        a = self.args
        orchestrator = Orchestrator(
            OrchestratorSettings(
                state_dir=Path(a.state_dir),
                listen=a.listen,
                snapshot_store=a.snapshot_store,
                node_lost_after_s=a.node_lost_after,
                gateway_listen=a.gateway_listen,
                gateway_port=a.gateway_port,
                upstream=a.upstream,
                gc_keep_last=a.gc_keep_last,
                default_time_slice_s=a.default_time_slice,
                default_priority=a.default_priority,
                kube_watch=a.kube_watch,
            )
        ).start()
        print(f"stasis server listening on {orchestrator.address}", file=self.out, flush=True)
        import signal
        import threading

        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        orchestrator.stop()
        return 0

    def submit(self) -> int:
        from orchestrator.specfile import load_spec_file

        spec = load_spec_file(Path(self.args.file))
        with self.client() as c:
            episode = c.submit(spec, request_id=self.args.request_id or None)
        print(episode.id, file=self.out)
        return 0

    def get(self) -> int:
        a = self.args
        with self.client() as c:
            if a.id:
                episodes = [c.get(a.id)]
            else:
                labels = dict(kv.split("=", 1) for kv in a.selector or [])
                episodes = c.episodes(states=a.state or [], node=a.node or "", labels=labels)
        if a.output in ("json", "yaml"):
            items = [e.to_json() for e in episodes]
            _dump(items[0] if a.id else {"items": items}, a.output, self.out)
            return 0
        now = time.time()
        header = ["ID", "STATE", "NODE", "SNAPSHOTS", "REWARD", "AGE"]
        if a.output == "wide":
            header += ["PRIORITY", "RUNS", "RUN-TIME", "ADDRESS", "REASON"]
        rows = [header]
        for e in episodes:
            row = [e.id, e.state + (" (held)" if e.held else ""), e.node or "-", str(e.snapshots), _reward(e)]
            row.append(_age(e.submitted_at, now))
            if a.output == "wide":
                row += [str(e.priority), str(e.runs), f"{e.run_seconds:.0f}s", e.address, e.reason]
            rows.append(row)
        _table(rows, self.out)
        return 0

    def wait(self) -> int:
        a = self.args
        wanted = [s.strip().upper() for s in a.for_state.split(",")]
        for s in wanted:
            if s not in EpisodeState.__members__:
                raise StasisError(
                    f"--for: {s!r} is not a state; use one of {', '.join(EpisodeState.__members__)}"
                )
        with self.client() as c:
            episode = c.wait(
                a.id, wanted, a.timeout, on_change=lambda e: self.progress(f"{e.id}: {e.state} ({e.reason})")
            )
        print(episode.state, file=self.out)
        return 0

    def _then_wait(self, c: StasisClient, episode: EpisodeInfo, states: list[str]) -> EpisodeInfo:
        if not self.args.wait:
            return episode
        return c.wait(
            episode.id,
            states,
            self.args.timeout,
            on_change=lambda e: self.progress(f"{e.id}: {e.state} ({e.reason})"),
        )

    def preempt(self) -> int:
        with self.client() as c:
            episode = self._then_wait(c, c.preempt(self.args.id, self.args.reason or ""), ["PREEMPTED"])
        print(f"{episode.id} {episode.state}", file=self.out)
        return 0

    def resume(self) -> int:
        with self.client() as c:
            episode = self._then_wait(c, c.resume(self.args.id, self.args.node or ""), ["RUNNING"])
        print(
            f"{episode.id} {episode.state}" + (f" on {episode.node}" if episode.node else ""), file=self.out
        )
        return 0

    def cancel(self) -> int:
        with self.client() as c:
            episode = c.cancel(self.args.id)
        print(f"{episode.id} {episode.state}", file=self.out)
        return 0

    def snapshots(self) -> int:
        with self.client() as c:
            items = c.snapshots(self.args.id)
        if self.args.output in ("json", "yaml"):
            _dump({"items": [s.to_json() for s in items]}, self.args.output, self.out)
            return 0
        now = time.time()
        rows = [["ID", "PARENT", "NODE", "REASON", "AGE", "STORED", "NEW", "DEDUP"]]
        for s in items:
            dedup = f"{s.logical_bytes / s.stored_bytes:.1f}x" if s.stored_bytes else "-"
            stored = _size(s.stored_bytes) + ("" if s.available else " (collected)")
            rows.append(
                [
                    s.id,
                    s.parent or "-",
                    s.node,
                    s.reason,
                    _age(s.created_at, now),
                    stored,
                    _size(s.new_bytes),
                    dedup,
                ]
            )
        _table(rows, self.out)
        return 0

    def export(self) -> int:
        dest = Path(self.args.output)
        with self.client() as c:
            size = c.export_snapshot(self.args.snapshot_id, dest)
        print(
            f"{dest} ({_size(size)}): config.dump, spec.dump, checkpoint/, rootfs-diff.tar, deleted.files",
            file=self.out,
        )
        return 0

    def events(self) -> int:
        with self.client() as c:
            items = c.events(self.args.id)
        if self.args.output in ("json", "yaml"):
            _dump({"items": [dict(e.__dict__) for e in items]}, self.args.output, self.out)
            return 0
        rows = [["TIME", "KIND", "FROM", "TO", "NODE", "REASON"]]
        for e in items:
            when = time.strftime("%H:%M:%S", time.localtime(e.at))
            rows.append([when, e.kind, e.from_state or "-", e.to_state or "-", e.node or "-", e.reason])
        _table(rows, self.out)
        return 0

    def trajectory(self) -> int:
        with self.client() as c:
            t = c.trajectory(self.args.id, include_branches=True)
        if self.args.output in ("json", "yaml"):
            _dump(t.to_json(), self.args.output, self.out)
            return 0
        reward = "-" if t.reward is None else f"{t.reward:g}"
        print(f"{t.episode_id}  {t.state}  reward {reward}  main branch: {len(t.main.turns)} turns, "
              f"{sum(t.main.loss_mask)} sampled of {len(t.main.token_ids)} tokens", file=self.out)  # fmt: skip
        rows = [["TURN", "BRANCH", "RUN", "TOKENS", "SUM-LOGPROB", "REPLAYED", "ABANDONED", "POLICY"]]
        for b in [t.main, *t.branches]:
            for turn in b.turns:
                rows.append([
                    str(turn.index), str(turn.branch), str(turn.run), str(len(turn.token_ids)),
                    f"{sum(turn.logprobs):.2f}", "yes" if turn.replayed else "-", "yes" if turn.abandoned else "-",
                    turn.policy_version,
                ])  # fmt: skip
        _table(rows, self.out)
        return 0

    def nodes(self) -> int:
        with self.client() as c:
            items = c.nodes()
        if self.args.output in ("json", "yaml"):
            _dump({"items": [n.to_json() for n in items]}, self.args.output, self.out)
            return 0
        now = time.time()
        rows = [["NAME", "STATE", "SLOTS", "MEMORY", "EPISODES", "BACKEND", "HEARTBEAT"]]
        for n in items:
            rows.append([
                n.name, n.state, f"{n.slots_used}/{n.slots}", f"{n.memory_used_mb}/{n.memory_mb}Mi",
                ",".join(n.episodes) or "-", n.backend, _age(n.last_heartbeat, now) + " ago" if n.last_heartbeat else "-",
            ])  # fmt: skip
        _table(rows, self.out)
        return 0

    def drain(self) -> int:
        with self.client() as c:
            node = c.drain(self.args.node)
            if self.args.wait:
                deadline = time.monotonic() + self.args.timeout
                while node.episodes:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"node {node.name} still holds {', '.join(node.episodes)}")
                    self.progress(f"{node.name}: waiting for {', '.join(node.episodes)} to move")
                    time.sleep(1)
                    node = next(n for n in c.nodes() if n.name == node.name)
        print(f"{node.name} {node.state}", file=self.out)
        return 0

    def uncordon(self) -> int:
        with self.client() as c:
            node = c.uncordon(self.args.node)
        print(f"{node.name} {node.state}", file=self.out)
        return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Stasis: snapshotting sandboxes for preemptible agent rollouts"
    )
    p.add_argument(
        "--addr", default=None, help=f"orchestrator address (default: $STASIS_ADDR or {DEFAULT_ADDR})"
    )
    p.add_argument(
        "--retry-for", type=float, default=10.0, help="seconds to retry while the orchestrator is unreachable"
    )
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

    env = os.environ.get
    srv = sub.add_parser(
        "server", help="run the orchestrator alone (cluster mode); flags default to $STASIS_*"
    )
    srv.add_argument("--listen", default=env("STASIS_LISTEN", "0.0.0.0:7070"))
    srv.add_argument("--state-dir", default=env("STASIS_STATE_DIR", "/var/lib/stasis"))
    srv.add_argument("--snapshot-store", default=env("STASIS_SNAPSHOT_STORE", ""))
    srv.add_argument("--node-lost-after", type=float, default=float(env("STASIS_NODE_LOST_AFTER", "10")))
    srv.add_argument("--gateway-listen", default=env("STASIS_GATEWAY_LISTEN", ""))
    srv.add_argument("--gateway-port", type=int, default=int(env("STASIS_GATEWAY_PORT", "8080")))
    srv.add_argument("--upstream", default=env("STASIS_UPSTREAM", ""))
    srv.add_argument("--gc-keep-last", type=int, default=int(env("STASIS_GC_KEEP_LAST", "3")))
    srv.add_argument(
        "--default-time-slice", type=float, default=float(env("STASIS_DEFAULT_TIME_SLICE_SECONDS", "0"))
    )
    srv.add_argument("--default-priority", type=int, default=int(env("STASIS_DEFAULT_PRIORITY", "0")))
    srv.add_argument(
        "--kube-watch",
        action=argparse.BooleanOptionalAction,
        default=bool(env("KUBERNETES_SERVICE_HOST")),
        help="drain nodes Kubernetes is reclaiming (default: on inside a cluster)",
    )

    s = sub.add_parser("submit", help="submit an episode; prints its id")
    s.add_argument("-f", "--file", required=True, help="episode spec, YAML or JSON")
    s.add_argument("--request-id", default="", help="makes retries of this submit idempotent")

    g = sub.add_parser("get", help="list episodes, or show one")
    g.add_argument("id", nargs="?")
    g.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table")
    g.add_argument("--state", action="append", help="filter by state (repeatable)")
    g.add_argument("--node", help="filter by node")
    g.add_argument("-l", "--selector", action="append", help="filter by label KEY=VALUE (repeatable)")

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

    n = sub.add_parser("nodes", help="list nodes")
    n.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    d = sub.add_parser("drain", help="move every episode off a node and keep new ones away")
    d.add_argument("node")
    d.add_argument("--wait", action="store_true")
    d.add_argument("--timeout", type=float, default=600)
    u = sub.add_parser("uncordon", help="let a drained node take episodes again")
    u.add_argument("node")
    return p


def main(argv: list[str] | None = None, out: Any = sys.stdout, err: Any = sys.stderr) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command in ("up", "server") else logging.WARNING
    )
    handler: Callable[[], int] = getattr(Commands(args, out, err), args.command)
    try:
        return handler()
    except TemporaryError as exc:
        print(f"{PROG}: {exc} (is `stasis up` running? set --addr or STASIS_ADDR)", file=err)
    except (StasisError, TimeoutError) as exc:
        print(f"{PROG}: {exc}", file=err)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=err)
    except BrokenPipeError:
        # The reader (head, less) went away: stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
