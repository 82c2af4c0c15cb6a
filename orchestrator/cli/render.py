"""How `stasis` prints what it read: tables, JSON or YAML, ages and durations, and a
trajectory's turns laid out as a tree."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.client import EpisodeInfo, TurnInfo


def millis(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


def age(since: float, now: float) -> str:
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


def edge(turn: TurnInfo) -> str:
    """How a turn hangs in the tree, and from which turn: `subagent<-12`."""
    edge = turn.edge or "-"
    return f"{edge}<-{turn.edge_parent}" if turn.edge_parent else edge


def prompt_state(turn: TurnInfo) -> str:
    """How a turn's prompt stands to the tokens before it: extends, BREAK@n (where it leaves
    them), or ? (not checked)."""
    if not turn.prefix_checked:
        return "?"
    return f"{turn.prompt_tokens}" if turn.prefix_exact else f"BREAK@{turn.common_prefix}"


def table(rows: Sequence[Sequence[str]], out: Any) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip(), file=out)


def dump(data: Any, fmt: str, out: Any) -> None:
    if fmt == "yaml":
        yaml.safe_dump(data, out, sort_keys=False)
    else:
        json.dump(data, out, indent=2)
        print(file=out)


def reward(e: EpisodeInfo) -> str:
    return "-" if e.reward is None else f"{e.reward:g}"
