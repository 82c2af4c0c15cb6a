"""What each `stasis` command does: call the typed client and print a table, JSON or YAML."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.cli import render, serving
from orchestrator.cli.parser import PLUGIN
from orchestrator.cli.progress import PullBoard, human_size
from orchestrator.client import EpisodeInfo, StasisClient, load_spec_file, taskimage
from orchestrator.domain import EpisodeState, InvalidArgument, Role, StasisError
from orchestrator.task import AGENTS, claude_code, load_task, task_episode


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
        return bool(a.namespace or a.kube_context) or Path(sys.argv[0]).name == PLUGIN

    def progress(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    # -- commands ---------------------------------------------------------------------------

    def up(self) -> int:
        return serving.up(self.args, self.out)

    def server(self) -> int:
        return serving.server(self.args, self.out)

    def submit(self) -> int:
        a = self.args
        if a.from_snapshot:
            if a.file:
                raise InvalidArgument(
                    "--file", "is not used with --from-snapshot: the snapshot fixes the spec"
                )
            with self.client() as c:
                group = (a.group, a.task or a.from_snapshot) if a.group else None
                started = c.submit_from_snapshot(
                    a.from_snapshot,
                    a.count,
                    labels=dict(a.label),
                    group=group,
                    request_id=a.request_id or None,
                )
            for episode in started:
                print(episode.id, file=self.out)
            return 0
        if not a.file:
            raise InvalidArgument(
                "--file", "is required: the episode spec (or start from a snapshot: --from-snapshot)"
            )
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

    def task(self) -> int:
        a = self.args
        task = load_task(Path(a.directory))
        if a.task_command == "build":
            with self.client() as c:
                name, built = taskimage.ensure_image(
                    c, task, dict(a.build_arg), self.progress, rebuild=a.rebuild
                )
            print(f"{name} {'built' if built else 'cached'}", file=self.out)
            return 0
        if a.agent_binary and a.agent != "claude-code":
            raise InvalidArgument("--agent-binary", "is for --agent claude-code")
        agent = claude_code(task, a.agent_binary) if a.agent_binary else AGENTS[a.agent](task)
        if a.request_id and not a.group:
            raise InvalidArgument("--group", "is required with --request-id")
        with self.client() as c:
            image = task.image or taskimage.ensure_image(c, task, dict(a.build_arg), self.progress)[0]
            laid = taskimage.ensure_agent_image(c, image, agent, self.progress) if agent.layer else ""
            spec = task_episode(task, agent, tuple(a.graded), dict(a.label), image, laid)
            if a.group:
                episodes = c.submit_group(spec, a.count, a.group, task.name, request_id=a.request_id or None)
            else:
                episodes = c.submit_many([spec] * a.count)
        for episode in episodes:
            print(episode.id, file=self.out)
        return 0

    def groups(self) -> int:
        a = self.args
        with self.client() as c:
            items = c.groups(a.id)
        if a.output in ("json", "yaml"):
            data = [g.to_json() for g in items]
            render.dump(data[0] if a.id else {"items": data}, a.output, self.out)
            return 0
        rows = [["GROUP", "TASK", "FINAL", "STATUS", "REWARDS"]]
        for g in items:
            status = "complete" if g.complete else f"broken: {g.problem}" if g.broken else "open"
            rewards = " ".join("-" if r is None else f"{r:g}" for r in g.rewards)
            rows.append([g.id, g.task_id, f"{g.final}/{g.size}", status, rewards])
        render.table(rows, self.out)
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
            render.dump(items[0] if a.id else {"items": items}, a.output, self.out)
            return 0
        now = time.time()
        header = ["ID", "STATE", "NODE", "SNAPSHOTS", "REWARD", "AGE"]
        if a.output == "wide":
            header += ["PRIORITY", "RUNS", "RUN-TIME", "ADDRESS", "REASON"]
        rows = [header]
        for e in episodes:
            row = [
                e.id,
                e.state + (" (held)" if e.held else ""),
                e.node or "-",
                str(e.snapshots),
                render.reward(e),
            ]
            row.append(render.age(e.submitted_at, now))
            if a.output == "wide":
                row += [str(e.priority), str(e.runs), f"{e.run_seconds:.0f}s", e.address, e.reason]
            rows.append(row)
        render.table(rows, self.out)
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

    def fork(self) -> int:
        a = self.args
        with self.client() as c:
            snapshot, children = c.fork(
                a.id, a.count, snapshot_id=a.snapshot, now=not (a.snapshot or a.latest), stop=a.stop,
                labels=dict(a.label),
            )  # fmt: skip
        print(f"snapshot {snapshot}", file=self.out)
        for child in children:
            print(child.id, file=self.out)
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
            render.dump({"items": [s.to_json() for s in items]}, self.args.output, self.out)
            return 0
        now = time.time()
        rows = [
            [
                "ID",
                "PARENT",
                "NODE",
                "REASON",
                "AGE",
                "STORED",
                "NEW",
                "DEDUP",
                "FROZEN",
                "FREE",
                "DURABLE",
                "FORKS",
            ]
        ]
        for s in items:
            moments = [render.millis(s.timings_ms.get(f"{k}_ms")) for k in ("frozen", "node_free", "durable")]
            dedup = f"{s.logical_bytes / s.stored_bytes:.1f}x" if s.stored_bytes else "-"
            stored = human_size(s.stored_bytes) + ("" if s.available else " (collected)")
            rows.append(
                [
                    s.id,
                    s.parent_id or "-",
                    s.node,
                    s.reason,
                    render.age(s.created_at, now),
                    stored,
                    human_size(s.new_bytes),
                    dedup,
                    *moments,
                    _forks(s.forks),
                ]
            )
        render.table(rows, self.out)
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
            render.dump({"items": [dict(e.__dict__) for e in items]}, self.args.output, self.out)
            return 0
        rows = [["TIME", "KIND", "FROM", "TO", "NODE", "REASON"]]
        for e in items:
            when = time.strftime("%H:%M:%S", time.localtime(e.at))
            rows.append([when, e.kind, e.from_state or "-", e.to_state or "-", e.node or "-", e.reason])
        render.table(rows, self.out)
        return 0

    def trajectory(self) -> int:
        with self.client() as c:
            t = c.trajectory(self.args.id, include_branches=True)
        if self.args.output in ("json", "yaml"):
            render.dump(t.to_json(), self.args.output, self.out)
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
        for turn, depth in render.tree_order(turns):
            rows.append([
                str(turn.id), str(turn.index), str(turn.branch), "  " * depth + render.edge(turn), str(turn.run),
                turn.mode, render.prompt_state(turn), str(len(turn.token_ids)), turn.finish_reason or "-",
                f"{sum(turn.logprobs):.2f}", "yes" if turn.replayed else "-", "yes" if turn.abandoned else "-",
                turn.policy_version,
            ])  # fmt: skip
        render.table(rows, self.out)
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
            render.dump({"items": [n.to_json() for n in items]}, self.args.output, self.out)
            return 0
        now = time.time()
        rows = [["NAME", "STATE", "SLOTS", "MEMORY", "DISK", "EPISODES", "BACKEND", "HEARTBEAT"]]
        for n in items:
            rows.append([
                n.name, n.state, f"{n.slots_used}/{n.slots}", f"{n.memory_used_mb}/{n.memory_mb}Mi",
                f"{n.disk_used_mb}/{n.disk_mb}Mi" if n.disk_mb else "-",
                ",".join(n.episodes) or "-", n.backend, render.age(n.last_heartbeat, now) + " ago" if n.last_heartbeat else "-",
            ])  # fmt: skip
        render.table(rows, self.out)
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
                    render.dump({"items": [i.to_json() for i in items]}, self.args.output, self.out)
                    return 0
                rows = [["NAME", "DIGEST", "SIZE", "NODES", "SOURCE"]]
                for i in items:
                    rows.append(
                        [i.name, i.digest[:19], human_size(i.size_bytes), ",".join(i.nodes) or "-", i.source]
                    )
                render.table(rows, self.out)
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
        render.table([("TABLE", "ROWS"), *((table, str(rows)) for table, rows in copied.items())], self.out)
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


def _forks(children: list[str]) -> str:
    """The episodes forked from a snapshot, as a table cell: the first two and how many more."""
    if not children:
        return "-"
    shown = ",".join(children[:2])
    return shown + (f" +{len(children) - 2}" if len(children) > 2 else "")
