"""`stasis trajectories export`: finished episodes' trajectories as a dataset file, built on the
client's GetTrajectory and ListEpisodes."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.client import EpisodeInfo, StasisClient, TrajectoryInfo, TurnInfo
from orchestrator.domain import InvalidArgument
from orchestrator.domain.episode import TERMINAL


def moment(text: str) -> float:
    """A time from the command line: seconds since the epoch, or ISO 8601 (UTC unless it says)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither seconds since the epoch nor ISO 8601"
        ) from None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def selected(
    client: StasisClient, args: argparse.Namespace, progress: Callable[[str], None] = lambda _text: None
) -> list[EpisodeInfo]:
    """The finished episodes the flags select: by labels, by when they finished and by group. A
    group's members come in index order, and those not finished yet are left out (and said so)."""
    labels = dict(_label(pair) for pair in args.label)
    found = client.episodes(states=[s.value for s in sorted(TERMINAL)], labels=labels)
    if args.group:
        (group,) = client.groups(args.group)  # NOT_FOUND if there is no such group
        index = {m.episode_id: m.index for m in group.members}
        found = sorted((e for e in found if e.id in index), key=lambda e: index[e.id])
        if group.final < group.size:
            progress(f"group {group.id}: {group.size - group.final} of {group.size} members not finished yet")
    return [
        e
        for e in found
        if (args.since is None or e.finished_at >= args.since)
        and (args.until is None or e.finished_at < args.until)
    ]


def _version() -> str:
    try:
        return metadata.version("stasis")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _label(pair: str) -> tuple[str, str]:
    key, eq, value = pair.partition("=")
    if not eq or not key:
        raise InvalidArgument("label", f"{pair!r} is not KEY=VALUE")
    return key, value


def export(
    client: StasisClient, args: argparse.Namespace, progress: Callable[[str], None]
) -> tuple[Path, int, int]:
    """Write the dataset; returns where, how many episodes and how many rows. A group whose
    members were all forked from one snapshot writes its trees as one set (`fork_group_rows`):
    the prefix its members share is trained once."""
    # The trajectory room and pyarrow load only when a dataset is written, not for every command.
    from orchestrator.trajectory import ExportSettings, dataset

    if args.max_paths < 1:
        raise InvalidArgument("max-paths", f"{args.max_paths} keeps no path of a tree; give 1 or more")
    dest = Path(args.output)
    fmt = args.format or ("jsonl" if dest.suffix == ".jsonl" else "parquet")
    settings = ExportSettings(
        max_paths=args.max_paths, mask_abandoned=not args.keep_masked, mask_uncertain=not args.keep_masked
    )
    episodes = selected(client, args, progress)
    forked = {e.forked_from for e in episodes}
    one_fork = bool(args.group) and args.records == "tree" and len(forked) == 1 and "" not in forked

    def trajectories() -> Iterator[tuple[EpisodeInfo, TrajectoryInfo, list[TurnInfo]]]:
        for e in episodes:
            progress(f"{e.id}: exporting")
            t = client.trajectory(e.id, include_branches=True)
            yield e, t, [turn for b in [t.main, *t.branches] for turn in b.turns]

    def batches() -> Iterator[list[dict[str, Any]]]:
        if one_fork:
            members = [
                dataset.ForkMember(
                    e.id,
                    turns,
                    own=frozenset(turn.id for turn in turns if not turn.shared),
                    reward=t.reward,
                    labels=t.labels,
                    group_index=t.group_index,
                )
                for e, t, turns in trajectories()
            ]
            parent = episodes[0].fork_parent
            yield dataset.fork_group_rows(members, parent_id=parent, group_id=args.group, settings=settings)
            return
        for e, t, turns in trajectories():
            yield dataset.rows(
                args.records, e.id, turns, reward=t.reward, labels=t.labels, group_id=t.group_id,
                group_index=t.group_index, settings=settings, agent_version=_version(),
            )  # fmt: skip

    try:
        count = dataset.write(args.records, fmt, dest, batches())
    except OSError as exc:
        raise InvalidArgument("output", f"cannot write {dest}: {exc.strerror}") from None
    return dest, len(episodes), count
