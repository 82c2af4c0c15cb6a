"""A dataset of episodes' exports, one row per tree stream, model call or ATIF trajectory, written
as Parquet or JSONL with pyarrow.

The rows of each kind have one fixed schema (`SCHEMAS`), so that files written apart concatenate
and an empty export still says what its columns are.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.trajectory.exports import ExportSettings, ExportTurn, call_records
from orchestrator.trajectory.interchange import atif
from orchestrator.trajectory.trees import fork_tree_samples, tree_samples

_DEFAULTS = ExportSettings()

KINDS = ("tree", "calls", "atif")
FORMATS = ("parquet", "jsonl")

_EPISODE = [
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("reward", pa.float64()),
    pa.field("labels", pa.map_(pa.string(), pa.string())),
    pa.field("group_id", pa.string()),
    pa.field("group_index", pa.int32()),
]
SCHEMAS: Mapping[str, pa.Schema] = {
    "tree": pa.schema(
        [
            *_EPISODE,
            pa.field("tree", pa.int32()),
            pa.field("path", pa.int32()),
            pa.field("branch", pa.int32()),
            pa.field("token_ids", pa.list_(pa.int64())),
            pa.field("loss_mask", pa.list_(pa.int8())),
            pa.field("weights", pa.list_(pa.float64())),
            pa.field("logprobs", pa.list_(pa.float64())),
            pa.field("policy_versions", pa.list_(pa.string())),
            pa.field("turn_ids", pa.list_(pa.int64())),
            pa.field("edges", pa.list_(pa.string())),
            pa.field("spans", pa.list_(pa.list_(pa.int64(), 2))),
            pa.field("logprobs_exact", pa.bool_()),
        ]
    ),
    "calls": pa.schema(
        [
            *_EPISODE,
            pa.field("turn_id", pa.int64()),
            pa.field("parent_id", pa.int64()),
            pa.field("edge", pa.string()),
            pa.field("edge_parent", pa.int64()),
            pa.field("branch", pa.int32()),
            pa.field("run", pa.int32()),
            pa.field("prompt_token_ids", pa.list_(pa.int64())),
            pa.field("completion_token_ids", pa.list_(pa.int64())),
            pa.field("logprobs", pa.list_(pa.float64())),
            pa.field("policy_version", pa.string()),
            pa.field("finish_reason", pa.string()),
            pa.field("mode", pa.string()),
            pa.field("prefix_exact", pa.bool_()),
            pa.field("logprobs_exact", pa.bool_()),
            pa.field("created_at", pa.float64()),
            pa.field("abandoned", pa.bool_()),
            pa.field("delivery_uncertain", pa.bool_()),
            pa.field("masked", pa.bool_()),
        ]
    ),
    "atif": pa.schema([*_EPISODE, pa.field("atif", pa.string())]),
}
"""The columns of each kind of row. An ATIF row holds one trajectory document (an episode's, or a
continuation it refers to) as JSON text in Parquet, as an object in JSONL."""


def rows(
    kind: str,
    episode_id: str,
    turns: Sequence[ExportTurn],
    *,
    reward: float | None = None,
    labels: Mapping[str, str] | None = None,
    group_id: str = "",
    group_index: int = 0,
    settings: ExportSettings = _DEFAULTS,
    agent_version: str = "",
) -> list[dict[str, Any]]:
    """An episode's rows of one kind; `group_id` and `group_index` name its GRPO group ("" for
    none) and its index there."""
    episode = _episode(episode_id, reward, labels, group_id, group_index)
    if kind == "tree":
        return [{**episode, **dataclasses.asdict(s)} for s in tree_samples(turns, settings).streams]
    if kind == "calls":
        return [{**episode, **dataclasses.asdict(c)} for c in call_records(turns, settings)]
    if kind == "atif":
        docs = atif(
            episode_id, turns, reward=reward, labels=labels, agent_version=agent_version, settings=settings
        )
        return [{**episode, "atif": json.dumps(doc, separators=(",", ":"))} for doc in docs]
    raise ValueError(f"no export of kind {kind!r}: one of {', '.join(KINDS)}")


def _episode(
    episode_id: str, reward: float | None, labels: Mapping[str, str] | None, group_id: str, group_index: int
) -> dict[str, Any]:
    """The columns every row of an episode starts with."""
    return {
        "episode_id": episode_id, "reward": reward, "labels": dict(labels or {}), "group_id": group_id,
        "group_index": group_index,
    }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ForkMember:
    """One fork child of a group exported as one set of trees (`fork_group_rows`)."""

    episode_id: str
    turns: Sequence[ExportTurn]
    """Its trajectory's turns, the ones it shares with its fork's parent included."""
    own: frozenset[int]
    """The ids of the turns it recorded itself (not shared)."""
    reward: float | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    group_index: int = 0


def fork_group_rows(
    members: Sequence[ForkMember],
    *,
    parent_id: str,
    group_id: str = "",
    settings: ExportSettings = _DEFAULTS,
) -> list[dict[str, Any]]:
    """The tree rows of the fork children of one snapshot (a GRPO group forked from a set-up) as
    one export (`fork_tree_samples`): the prefix they share with their parent, `parent_id`, is
    trained once, with the trees' weights. A stream is the row of the member whose turn ends it
    (its episode id, reward, labels and index); one of shared turns alone (a path of the
    parent's that no member's holds) is the parent's, with no reward and index -1."""
    owner = {turn_id: m for m in members for turn_id in m.own}
    out = []
    for stream in fork_tree_samples([m.turns for m in members], settings).streams:
        m = owner.get(stream.turn_ids[-1])
        if m is None:  # the parent's
            episode = _episode(parent_id, None, None, group_id, -1)
        else:
            episode = _episode(m.episode_id, m.reward, m.labels, group_id, m.group_index)
        out.append({**episode, **dataclasses.asdict(stream)})
    return out


def write(kind: str, fmt: str, dest: Path, episode_rows: Iterable[list[dict[str, Any]]]) -> int:
    """Write the rows to `dest` (its parent must exist), whole or not at all; returns how many."""
    if fmt not in FORMATS:
        raise ValueError(f"no dataset format {fmt!r}: one of {', '.join(FORMATS)}")
    schema = SCHEMAS[kind]
    tmp = dest.with_name(f".{dest.name}.partial")
    count = 0
    try:
        if fmt == "parquet":
            with pq.ParquetWriter(tmp, schema) as writer:
                for batch in episode_rows:
                    if batch:
                        writer.write_table(pa.Table.from_pylist([_arrow(r) for r in batch], schema=schema))
                        count += len(batch)
        else:
            with open(tmp, "w", encoding="utf-8") as out:
                for batch in episode_rows:
                    for r in batch:
                        out.write(_json_line(kind, r))
                        count += 1
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def read(dest: Path) -> pa.Table:
    """A Parquet export as a table."""
    return pq.read_table(dest)


def _arrow(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "labels": sorted(row["labels"].items())}


def _json_line(kind: str, row: dict[str, Any]) -> str:
    if kind == "atif":
        row = {**row, "atif": json.loads(row["atif"])}  # a document, not text, in JSONL
    return json.dumps(row, separators=(",", ":")) + "\n"
