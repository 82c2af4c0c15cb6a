"""The commands on episodes and what they leave behind: submit, get, wait, preempt, resume,
cancel, logs, snapshots, events, export, groups, trajectory, trajectories and policy."""

from __future__ import annotations

import argparse

from orchestrator.cli.datasets import moment
from orchestrator.cli.parser._helptext import EP, Subparsers, command, output


def add_episode_commands(sub: Subparsers) -> None:
    s = command(
        sub,
        "submit",
        "submit an episode, or N of them, or a GRPO group; prints their ids",
        ("Submit one episode", "stasis submit -f episode.yaml"),
        ("Submit 16 episodes of one spec, all or none", "stasis submit -f episode.yaml -n 16"),
        (
            "Submit a GRPO group of 8 members, safe to retry",
            "stasis submit -f task-17.yaml -n 8 --group g-17 --request-id g-17-try",
        ),
        (
            "Start 8 episodes from a set-up's snapshot, labelled",
            f"stasis submit --from-snapshot {EP}-s1 -n 8 --label batch=b7",
        ),
        about="The spec is YAML or JSON (see the episode spec in docs/cli.md); it is checked before it "
        "is sent, and a bad value is refused with its field named. With --from-snapshot there is no "
        "spec file: each episode restores the snapshot, as a fork child of the episode that took it.",
    )
    s.add_argument(
        "-f", "--file", default="", help="episode spec, YAML or JSON (required without --from-snapshot)"
    )
    s.add_argument(
        "--from-snapshot",
        default="",
        metavar="SNAPSHOT_ID",
        help="start each episode from this committed snapshot of any episode instead of a spec; empty: none",
    )
    _added_labels(s, "with --from-snapshot, a label each episode carries besides the snapshot's episode's")
    s.add_argument(
        "--request-id",
        default="",
        metavar="ID",
        help="makes retries of this submit idempotent (member i of a group: ID/i); empty: none",
    )
    s.add_argument(
        "-n", "--count", type=_count, default=1, metavar="N",
        help="episodes of the spec, in one commit (default %(default)s; after `submit`, -n is this, so "
        "give a namespace as --namespace)",
    )  # fmt: skip
    s.add_argument(
        "--group",
        default="",
        metavar="GROUP",
        help="submit the N episodes as the members of this GRPO group; empty: no group",
    )
    s.add_argument(
        "--task",
        default="",
        metavar="TASK",
        help="the group's task id (default: the spec file's name without extension)",
    )
    s.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        metavar="VERSIONS",
        help="the group's bound on how many policy versions a turn may lag (default: no bound)",
    )

    tk = command(
        sub,
        "task",
        "Harbor tasks: run a task directory as episodes, graded as Harbor grades",
        ("Check a task with its own solution", "stasis task run ./tasks/fix-config --agent oracle"),
        ("Build a task's environment into the cluster", "stasis task build ./tasks/fix-config"),
    )
    tk_sub = tk.add_subparsers(dest="task_command", required=True, metavar="ACTION")
    tb = command(
        tk_sub,
        "build",
        "build a task's environment/ with Docker and import it into the cluster; prints its name",
        ("Build a task's environment", "stasis task build ./tasks/fix-config"),
        ("Build it from another base", "stasis task build ./tasks/fix-config --build-arg BASE=debian:12"),
        about="The image is named after the digest of environment/ and the build arguments: a "
        "context the cluster has already is not built again (prints `cached`), and a changed file "
        "builds a new image. The Dockerfile is built as it is. `task run` builds it too when needed.",
    )
    tb.add_argument("directory", metavar="DIR", help="the task directory")
    _build_args(tb)
    tb.add_argument("--rebuild", action="store_true", help="build and import even if the cluster has it")
    tr = command(
        tk_sub,
        "run",
        "submit N episodes of a Harbor task directory; prints their ids",
        ("Check a task with its own solution", "stasis task run ./tasks/fix-config --agent oracle"),
        ("Let Claude Code work on a task", "stasis task run ./tasks/fix-config --agent claude-code"),
        (
            "Run a task as a GRPO group of 8, safe to retry",
            "stasis task run ./tasks/fix-config --agent oracle -n 8 --group g-3 --request-id g-3-try",
        ),
        about="The directory holds instruction.md, task.toml, tests/test.sh and, for the oracle, "
        "solution/solve.sh (docs/tasks.md). The agent works in [environment] docker_image (a harness "
        "laid over it in a layer of its own); a "
        "verifier rooted in that image as built copies the agent's files in at their own paths, "
        "runs bash /tests/test.sh and reads /logs/verifier/reward.txt or reward.json. A bad "
        "task.toml is refused naming the field.",
    )
    tr.add_argument("directory", metavar="DIR", help="the task directory")
    _build_args(tr)
    tr.add_argument(
        "--agent",
        required=True,
        choices=("oracle", "nop", "claude-code"),
        help="oracle runs the task's solution/solve.sh; nop does nothing; claude-code is laid over the "
        "environment and given instruction.md, through the gateway",
    )
    tr.add_argument(
        "--agent-binary",
        default="",
        metavar="PATH",
        help="with --agent claude-code, the Claude Code binary to lay over the environment "
        "(default: the release scripts/host-setup.sh pinned)",
    )
    tr.add_argument(
        "--graded",
        action="append",
        default=[],
        metavar="PATH",
        help="an absolute path whose final contents the tests see (repeatable; default: the image's WORKDIR)",
    )
    _added_labels(tr, "a label each episode carries besides task= and agent=")
    tr.add_argument(
        "-n", "--count", type=_count, default=1, metavar="N",
        help="episodes of the task, in one commit (default %(default)s; give a namespace as --namespace)",
    )  # fmt: skip
    tr.add_argument(
        "--group", default="", metavar="GROUP", help="submit the N episodes as this GRPO group; empty: none"
    )
    tr.add_argument(
        "--request-id",
        default="",
        metavar="ID",
        help="with --group, makes retries idempotent (member i: ID/i); empty: none",
    )

    gr = command(
        sub,
        "groups",
        "GRPO groups: members final of N, and their rewards",
        ("List every group, oldest first", "stasis groups"),
        ("Show one group as JSON", "stasis groups g-17 -o json"),
    )
    gr.add_argument("id", nargs="?", metavar="ID", default="", help="a GRPO group id; omitted: every group")
    output(gr)

    g = command(
        sub,
        "get",
        "list episodes, or show one",
        ("List every episode", "stasis get"),
        (
            "List the running episodes on node-1, with more columns",
            "stasis get --state RUNNING --node node-1 -o wide",
        ),
        ("Show one episode as YAML", f"stasis get {EP} -o yaml"),
        (
            "List the episodes labelled team=rl in the Kubernetes namespace rl",
            "kubectl stasis get -l team=rl -n rl",
        ),
    )
    g.add_argument("id", nargs="?", metavar="ID", help="an episode id; omitted: list episodes")
    output(g, "table", "wide", "json", "yaml")
    g.add_argument(
        "--state",
        metavar="STATE",
        action="append",
        help="only episodes in this state (PENDING, RUNNING, PREEMPTED, SUCCEEDED, ...); repeatable",
    )
    g.add_argument("--node", metavar="NODE", help="only episodes on this node")
    g.add_argument(
        "-l",
        "--selector",
        action="append",
        type=_label,
        metavar="KEY=VALUE",
        help="only episodes with this label; repeatable",
    )

    w = command(
        sub,
        "wait",
        "wait until an episode reaches a state",
        ("Wait up to an hour for an episode to succeed", f"stasis wait {EP} --for SUCCEEDED --timeout 3600"),
        ("Wait until it ends either way", f"stasis wait {EP} --for SUCCEEDED,FAILED,CANCELLED"),
        about="Prints each state change on stderr and the state reached on stdout; fails at once if "
        "the episode ends in another state.",
    )
    w.add_argument("id", metavar="ID", help="the episode's id")
    w.add_argument(
        "--for",
        dest="for_state",
        required=True,
        metavar="STATE[,STATE]",
        help="the state to wait for, or several separated by commas",
    )
    w.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="SECONDS",
        help="give up after this long (default %(default)s)",
    )

    for name, text, state, cases in (
        (
            "preempt",
            "checkpoint a running episode and hold it (not rescheduled until resumed)",
            "PREEMPTED",
            (
                ("Preempt an episode and keep it held", f"stasis preempt {EP}"),
                (
                    "Preempt it with a reason, and wait until its snapshot is taken",
                    f'stasis preempt {EP} --reason "make room for group g-18" --wait --timeout 120',
                ),
            ),
        ),
        (
            "resume",
            "resume a preempted episode",
            "RUNNING",
            (
                ("Resume an episode wherever there is room", f"stasis resume {EP}"),
                (
                    "Resume it on node-2, and wait until it runs there",
                    f"stasis resume {EP} --node node-2 --wait",
                ),
            ),
        ),
    ):
        c = command(sub, name, text, *cases)
        c.add_argument("id", metavar="ID", help="the episode's id")
        if name == "preempt":
            c.add_argument(
                "--reason", default="", help="why, recorded in the episode's events; empty: none given"
            )
        else:
            c.add_argument(
                "--node",
                default="",
                metavar="NODE",
                help="restore on this node; empty: wherever the scheduler finds room",
            )
        c.add_argument("--wait", action="store_true", help=f"wait until it is {state}")
        c.add_argument(
            "--timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="with --wait, give up after this long (default %(default)s)",
        )

    f = command(
        sub,
        "fork",
        "fork an episode into N children, each an episode of its own; prints the snapshot and their ids",
        ("Fork a running episode 8 ways now; it runs on", f"stasis fork {EP} -n 8"),
        ("Fork it 4 ways and stop it at the snapshot", f"stasis fork {EP} -n 4 --stop"),
        ("Fork one of its snapshots", f"stasis fork {EP} -n 8 --snapshot {EP}-s2"),
        about="Without --snapshot or --latest the episode is checkpointed now (a fork asked while a "
        "checkpoint is under way joins it). Each child restores that snapshot with its own id, "
        "address, host name and machine-id, and /.stasis/fork.json says which child it is.",
    )
    f.add_argument("id", metavar="ID", help="the episode to fork")
    f.add_argument(
        "-n", "--count", type=_count, default=1, metavar="N",
        help="children (default %(default)s; after `fork`, -n is this, so give a namespace as --namespace)",
    )  # fmt: skip
    source = f.add_mutually_exclusive_group()
    source.add_argument(
        "--snapshot",
        default="",
        metavar="SNAPSHOT_ID",
        help="fork this snapshot of the episode; empty: see --latest",
    )
    source.add_argument("--latest", action="store_true", help="fork the episode's latest snapshot")
    source.add_argument(
        "--stop", action="store_true", help="checkpoint now and stop the episode there (held)"
    )
    _added_labels(f, "a label each child carries besides the episode's")

    c = command(
        sub,
        "cancel",
        "cancel an episode; its sandbox is removed",
        ("Cancel an episode", f"stasis cancel {EP}"),
    )
    c.add_argument("id", metavar="ID", help="the episode's id")

    for name, text, example in (
        (
            "snapshots",
            "snapshot history with lineage",
            "List an episode's snapshots, with their sizes and timings",
        ),
        ("events", "state changes and decisions", "List an episode's state changes and scheduling decisions"),
    ):
        c = command(
            sub,
            name,
            text,
            (example, f"stasis {name} {EP}"),
            ("The same as JSON", f"stasis {name} {EP} -o json"),
        )
        c.add_argument("id", metavar="ID", help="the episode's id")
        output(c)

    x = command(
        sub,
        "export",
        "write a snapshot as a container checkpoint archive (checkpointctl reads it)",
        ("Write an episode's second snapshot to a file", f"stasis export {EP}-s2 -o checkpoint.tar"),
    )
    x.add_argument(
        "snapshot_id",
        metavar="SNAPSHOT_ID",
        help=f"the snapshot's id ({EP}-s2), as `stasis snapshots` lists it",
    )
    x.add_argument("-o", "--output", required=True, metavar="FILE", help="archive file to write")

    t = command(
        sub,
        "trajectory",
        "recorded turns: token ids, behaviour log-probs, branches, reward",
        ("Show an episode's turns as a tree", f"stasis trajectory {EP}"),
        ("Every turn with its token ids and log-probs, as JSON", f"stasis trajectory {EP} -o json"),
    )
    t.add_argument("id", metavar="ID", help="the episode's id")
    output(t)

    ts = command(
        sub,
        "trajectories",
        "finished episodes' trajectories as a dataset for a trainer",
        ("Export every finished episode's trees as Parquet", "stasis trajectories export -o trees.parquet"),
    )
    ts_sub = ts.add_subparsers(dest="trajectories_command", required=True, metavar="ACTION")
    tx = command(
        ts_sub,
        "export",
        "write tree samples, per-call records or ATIF as Parquet or JSONL",
        ("Export every finished episode's trees as Parquet", "stasis trajectories export -o trees.parquet"),
        (
            "One row per model call of the episodes labelled team=rl finished since the 1st of June",
            "stasis trajectories export -o calls.jsonl --records calls --label team=rl --since 2026-06-01",
        ),
        ("A GRPO group's members, in index order", "stasis trajectories export -o g-17.parquet --group g-17"),
    )
    tx.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="file to write (.parquet, or .jsonl)"
    )
    tx.add_argument("--records", choices=("tree", "calls", "atif"), default="tree",
                    help="tree: at most --max-paths streams per tree with per-token weights; calls: one "
                    "row per model call with its parent, for trie packing; atif: one ATIF v1.8 trajectory "
                    "(default %(default)s)")  # fmt: skip
    tx.add_argument("--format", choices=("parquet", "jsonl"), default="",
                    help="default: jsonl for a .jsonl file, else parquet")  # fmt: skip
    tx.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                    help="only episodes with this label; repeatable (default: any)")  # fmt: skip
    tx.add_argument("--since", type=moment, default=None, metavar="TIME",
                    help="only episodes finished at or after TIME (epoch seconds, or ISO 8601, UTC unless "
                    "it says; default: any)")  # fmt: skip
    tx.add_argument(
        "--until",
        type=moment,
        default=None,
        metavar="TIME",
        help="only episodes finished before TIME (as --since; default: any)",
    )
    tx.add_argument(
        "--group",
        default="",
        metavar="GROUP",
        help="only the members of this GRPO group, in index order (a group forked from one snapshot "
        "writes its tree records as one set of trees: the prefix its members share, once); empty: any episode",
    )
    tx.add_argument(
        "--max-paths", type=int, default=5, help="streams kept per tree (tree records; default %(default)s)"
    )
    tx.add_argument("--keep-masked", action="store_true",
                    help="train on abandoned turns and turns whose delivery is uncertain too (flagged either way)")  # fmt: skip
    pol = command(
        sub,
        "policy",
        "policy versions: publish a trainer's weight update",
        ("After a weight update, make 7 the current policy version", "stasis policy publish 7"),
    )
    pol_sub = pol.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    pp = command(
        pol_sub,
        "publish",
        "make VERSION the current policy version; turns whose model server names none record it "
        "from then on; versions only go up",
        ("After a weight update, make 7 the current policy version", "stasis policy publish 7"),
    )
    pp.add_argument(
        "version", type=int, metavar="VERSION", help="a positive integer above the version published now"
    )

    lg = command(
        sub,
        "logs",
        "a harness's output across all its runs, as kubectl logs",
        ("Print an episode's output so far", f"stasis logs {EP}"),
        ("Follow it until the episode ends", f"stasis logs {EP} -f"),
        ("Only its second run (its first restore)", f"stasis logs {EP} --run 2"),
    )
    lg.add_argument("id", metavar="ID", help="the episode's id")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the episode ends")
    lg.add_argument(
        "--run",
        type=int,
        default=0,
        metavar="N",
        help="only this run (1 is the first start); 0: all (default %(default)s)",
    )


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of episodes (after `submit` and `fork`, a namespace is --namespace)"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} episodes: give at least 1")
    return count


def _build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--build-arg",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a build argument of environment/Dockerfile, part of the image's digest (repeatable)",
    )


def _added_labels(p: argparse.ArgumentParser, text: str) -> None:
    """--label KEY=VALUE, repeatable: labels the new episodes carry."""
    p.add_argument(
        "--label", type=_label, action="append", default=[], metavar="KEY=VALUE", help=f"{text} (repeatable)"
    )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value
