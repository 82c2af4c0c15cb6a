"""What each `stasis` command does: call the typed client and print a table, JSON or YAML."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.cli.progress import PullBoard, human_size
from orchestrator.client import EpisodeInfo, StasisClient, TurnInfo, load_spec_file
from orchestrator.domain import EpisodeState, InvalidArgument, Role, StasisError
from protos.shared.tls import TlsFiles


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


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


def tree_order(turns: list[TurnInfo]) -> list[tuple[TurnInfo, int]]:
    """The turns depth first down the tree, each under the one it hangs from (its `edge_parent`,
    else its parent), siblings in the order they were recorded, with the depth of its branch:
    main and branches that hang from nothing are 0, another is one below the branch it leaves."""
    by_id = {t.id: t for t in turns}
    under: dict[int, list[TurnInfo]] = {}
    first: dict[int, TurnInfo] = {}
    for t in sorted(turns, key=lambda t: t.id):
        above = t.edge_parent or t.parent_id
        under.setdefault(above if above in by_id else 0, []).append(t)
        first.setdefault(t.branch, t)

    def depth(branch: int, seen: frozenset[int] = frozenset()) -> int:
        start = first[branch]
        above = by_id.get(start.edge_parent or start.parent_id)
        if branch == 0 or above is None or above.branch in seen | {branch}:
            return 0
        return depth(above.branch, seen | {branch}) + 1

    out: list[tuple[TurnInfo, int]] = []
    todo = list(reversed(under.get(0, [])))
    while todo:
        turn = todo.pop()
        out.append((turn, depth(turn.branch)))
        todo += reversed(under.get(turn.id, []))
    return out


def _edge(turn: TurnInfo) -> str:
    """How a turn hangs in the tree, and from which turn: `subagent<-12`."""
    edge = turn.edge or "-"
    return f"{edge}<-{turn.edge_parent}" if turn.edge_parent else edge


def _prompt_state(turn: TurnInfo) -> str:
    """How a turn's prompt stands to the tokens before it: extends, BREAK@n (where it leaves
    them), or ? (not checked)."""
    if not turn.prefix_checked:
        return "?"
    return f"{turn.prompt_tokens}" if turn.prefix_exact else f"BREAK@{turn.common_prefix}"


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


class Subcommands:
    """One method per `stasis` subcommand, named as it is; each returns the exit status."""

    def __init__(self, args: argparse.Namespace, out: Any = sys.stdout, err: Any = sys.stderr) -> None:
        self.args = args
        self.out = out
        self.err = err

    def client(self) -> StasisClient:
        a = self.args
        if self._in_kubernetes():
            from orchestrator.client.kube import discover

            found = discover(a.namespace, a.kube_context)
            return StasisClient(context=found.context, retry_for_s=a.retry_for)
        return StasisClient(a.addr, config=a.config, context=a.context, retry_for_s=a.retry_for)

    def _in_kubernetes(self) -> bool:
        """Whether Stasis is to be found in Kubernetes: asked for by -n or --kube-context, or run
        as `kubectl stasis` with no address and no context of the client config named."""
        a = self.args
        if a.addr or os.environ.get("STASIS_ADDR") or a.context:
            return False
        return bool(a.namespace or a.kube_context) or Path(sys.argv[0]).name == "kubectl-stasis"

    def progress(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    # -- commands ---------------------------------------------------------------------------

    # `up` and `server` import the whole control plane; the other commands need only the client.

    def up(self) -> int:
        from orchestrator.cli.local import LocalSettings, run_foreground

        a = self.args
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
        return run_foreground(settings, self.out)

    def _orchestrator_certificate(self) -> TlsFiles:
        """The certificate given, or one issued from the CA's key (`--tls-ca-key`) into the state
        dir for the names `--tls-hosts` lists, and kept while it is current."""
        from orchestrator.cli.pki import ClusterPki

        a = self.args
        if a.tls_cert:
            return TlsFiles(Path(a.tls_ca), Path(a.tls_cert), Path(a.tls_key))
        hosts = tuple(h.strip() for h in a.tls_hosts.split(",") if h.strip())
        try:
            return ClusterPki(Path(a.state_dir) / "pki", (Path(a.tls_ca), Path(a.tls_ca_key))).orchestrator(
                hosts
            )
        except (OSError, ValueError) as exc:
            raise InvalidArgument(
                "--tls-ca-key", f"cannot issue the orchestrator's certificate: {exc}"
            ) from None

    def server(self) -> int:
        from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings
        from orchestrator.control import ControlSettings
        from orchestrator.gateway import GatewaySettings
        from snapshots import set_aside_startup_objects

        a = self.args
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
                tls=self._orchestrator_certificate(),
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
        print(f"stasis server listening on {orchestrator.address}", file=self.out, flush=True)
        if auth is not None:
            print(f"nodes register on {orchestrator.cluster_address}", file=self.out, flush=True)
        if not orchestrator.leading:
            print("standing by: another orchestrator leads", file=self.out, flush=True)
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

    def submit(self) -> int:
        a = self.args
        path = Path(a.file)
        spec = load_spec_file(path)
        if not a.group and (a.task or a.max_staleness is not None):
            raise InvalidArgument("--group", "is required with --task or --max-staleness")
        with self.client() as c:
            if a.group:
                episodes = c.submit_group(
                    spec, a.count, a.group, a.task or path.stem.split(".")[0],
                    max_staleness=a.max_staleness, request_id=a.request_id or None,
                )  # fmt: skip
            elif a.count > 1:
                episodes = c.submit_many([spec] * a.count)
            else:
                episodes = [c.submit(spec, request_id=a.request_id or None)]
        for episode in episodes:
            print(episode.id, file=self.out)
        return 0

    def groups(self) -> int:
        a = self.args
        with self.client() as c:
            items = c.groups(a.id)
        if a.output in ("json", "yaml"):
            data = [g.to_json() for g in items]
            _dump(data[0] if a.id else {"items": data}, a.output, self.out)
            return 0
        rows = [["GROUP", "TASK", "FINAL", "STATUS", "REWARDS"]]
        for g in items:
            status = "complete" if g.complete else f"broken: {g.problem}" if g.broken else "open"
            rewards = " ".join("-" if r is None else f"{r:g}" for r in g.rewards)
            rows.append([g.id, g.task_id, f"{g.final}/{g.size}", status, rewards])
        _table(rows, self.out)
        return 0

    def get(self) -> int:
        a = self.args
        with self.client() as c:
            if a.id:
                episodes = [c.get(a.id)]
            else:
                labels = dict(a.selector or [])
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
        rows = [
            ["ID", "PARENT", "NODE", "REASON", "AGE", "STORED", "NEW", "DEDUP", "FROZEN", "FREE", "DURABLE"]
        ]
        for s in items:
            moments = [_millis(s.timings_ms.get(f"{k}_ms")) for k in ("frozen", "node_free", "durable")]
            dedup = f"{s.logical_bytes / s.stored_bytes:.1f}x" if s.stored_bytes else "-"
            stored = human_size(s.stored_bytes) + ("" if s.available else " (collected)")
            rows.append(
                [
                    s.id,
                    s.parent_id or "-",
                    s.node,
                    s.reason,
                    _age(s.created_at, now),
                    stored,
                    human_size(s.new_bytes),
                    dedup,
                    *moments,
                ]
            )
        _table(rows, self.out)
        return 0

    def export(self) -> int:
        dest = Path(self.args.output)
        with self.client() as c:
            size = c.export_snapshot(self.args.snapshot_id, dest)
        print(
            f"{dest} ({human_size(size)}): config.dump, spec.dump, checkpoint/, rootfs-diff.tar, deleted.files",
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
        turns = [turn for b in [t.main, *t.branches] for turn in b.turns]
        live = [turn for turn in turns if not turn.abandoned]
        sampled = sum(sum(s.loss_mask) for s in t.samples)
        print(f"{t.episode_id}  {t.state}  reward {reward}  {len(live)} live turns of {len(turns)}, "
              f"{len(t.samples)} samples holding {sampled} sampled tokens, {t.prompt_breaks} prompt breaks",
              file=self.out)  # fmt: skip
        inexact = sum(not s.logprobs_exact for s in t.samples)
        if inexact:
            print(f"warning: {inexact} samples hold log-probs that are not of the sampling distribution",
                  file=self.out)  # fmt: skip
        published = max((s.published_version for s in t.samples), default=0)
        if published:
            lags = [lag for s in t.samples for lag, known, m in zip(s.staleness, s.staleness_known, s.loss_mask,
                    strict=True) if m and known]  # fmt: skip
            unordered = sampled - len(lags)
            stale = f"{min(lags)} to {max(lags)} versions stale" if lags else "of no ordered version"
            print(f"policy version {published} published: sampled tokens {stale}"
                  + (f", {unordered} of no ordered version" if lags and unordered else ""), file=self.out)  # fmt: skip
        rows = [["ID", "TURN", "BRANCH", "EDGE", "RUN", "MODE", "PROMPT", "TOKENS", "FINISH", "SUM-LOGPROB",
                 "REPLAYED", "ABANDONED", "POLICY"]]  # fmt: skip
        for turn, depth in tree_order(turns):
            rows.append([
                str(turn.id), str(turn.index), str(turn.branch), "  " * depth + _edge(turn), str(turn.run),
                turn.mode, _prompt_state(turn), str(len(turn.token_ids)), turn.finish_reason or "-",
                f"{sum(turn.logprobs):.2f}", "yes" if turn.replayed else "-", "yes" if turn.abandoned else "-",
                turn.policy_version,
            ])  # fmt: skip
        _table(rows, self.out)
        return 0

    def trajectories(self) -> int:
        from orchestrator.cli.datasets import export

        with self.client() as c:
            dest, episodes, rows = export(c, self.args, self.progress)
        print(f"{dest}: {rows} {self.args.records} rows of {episodes} episodes", file=self.out)
        return 0

    def policy(self) -> int:
        with self.client() as c:
            published = c.publish_policy(self.args.version)
        print(f"policy version {published.version} published", file=self.out)
        return 0

    def nodes(self) -> int:
        with self.client() as c:
            items = c.nodes()
        if self.args.output in ("json", "yaml"):
            _dump({"items": [n.to_json() for n in items]}, self.args.output, self.out)
            return 0
        now = time.time()
        rows = [["NAME", "STATE", "SLOTS", "MEMORY", "DISK", "EPISODES", "BACKEND", "HEARTBEAT"]]
        for n in items:
            rows.append([
                n.name, n.state, f"{n.slots_used}/{n.slots}", f"{n.memory_used_mb}/{n.memory_mb}Mi",
                f"{n.disk_used_mb}/{n.disk_mb}Mi" if n.disk_mb else "-",
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

    def image(self) -> int:
        with self.client() as c:
            action = self.args.image_command
            if action == "import":
                board = PullBoard(self.err)
                try:
                    image = c.import_image(self.args.name, self.args.source, self.progress, board)
                finally:
                    board.close()
                nodes = ", ".join(image.nodes) or "no node yet"
                print(f"{image.name} {image.digest} {human_size(image.size_bytes)} on {nodes}", file=self.out)
            elif action == "rm":
                print(f"{c.remove_image(self.args.name).name} removed", file=self.out)
            else:
                items = c.images()
                if self.args.output in ("json", "yaml"):
                    _dump({"items": [i.to_json() for i in items]}, self.args.output, self.out)
                    return 0
                rows = [["NAME", "DIGEST", "SIZE", "NODES", "SOURCE"]]
                for i in items:
                    rows.append(
                        [i.name, i.digest[:19], human_size(i.size_bytes), ",".join(i.nodes) or "-", i.source]
                    )
                _table(rows, self.out)
        return 0

    def logs(self) -> int:
        with self.client() as c:
            for chunk in c.logs(self.args.id, run=self.args.run, follow=self.args.follow):
                self.out.write(chunk.decode(errors="replace"))
                self.out.flush()
        return 0

    def config(self) -> int:
        from orchestrator.client import config_path, merge_context

        a = self.args
        path = config_path(a.config)
        cluster = {"server": a.server}
        for key, value in (
            ("certificate-authority", a.certificate_authority),
            ("tls-server-name", a.tls_server_name),
        ):
            if value:
                cluster[key] = str(Path(value).resolve()) if key == "certificate-authority" else value
        user = {"token-file": str(Path(a.token_file).resolve())} if a.token_file else {}
        merge_context(path, a.name, cluster=cluster, user=user)
        self.progress(f"context {a.name} ({a.server}) is current in {path}")
        return 0

    def state(self) -> int:
        from orchestrator.api import migrate_to_postgres

        a = self.args
        if not a.database_url:
            raise InvalidArgument(
                "--database-url", "is required (or $STASIS_DATABASE_URL): the database to copy into"
            )
        state_db = Path(a.state_dir) / "state.db"
        copied = migrate_to_postgres(state_db, a.database_url)
        _table([("TABLE", "ROWS"), *((table, str(rows)) for table, rows in copied.items())], self.out)
        self.progress(f"{state_db} is in PostgreSQL now; start the orchestrator with --database-url")
        return 0

    def token(self) -> int:
        from orchestrator.api import add_token

        a = self.args
        try:
            token = add_token(Path(a.tokens_file), a.name, Role.parse(a.role))
        except ValueError as exc:
            raise InvalidArgument("--tokens-file", str(exc)) from None
        print(token, file=self.out)
        self.progress(
            f"{a.name} ({a.role}) added to {a.tokens_file}; this is the only time the token is shown"
        )
        return 0
