"""What both state stores agree on: how domain records are kept as rows, how a request is
fingerprinted, and what a transition changes. The statements over them are in the aggregates'
modules (`episodes.py`, `nodes.py`, ...)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

from orchestrator.domain import (
    ALLOWED,
    TERMINAL,
    Conflict,
    Episode,
    EpisodeSpec,
    EpisodeState,
    FailedPrecondition,
    Group,
    InvalidArgument,
    NodeRecord,
    NodeState,
    SnapshotRecord,
    codec,
)

EPISODE_COLUMNS = (
    "node", "sandbox_id", "runs", "run_started_at", "run_seconds", "queued_at", "held", "pinned_node",
    "snapshots", "last_snapshot_id", "restored_from", "pending_snapshot_id", "pending_reason", "last_autosave_at",
    "exit_code", "reward", "finished_at", "not_before", "attempts", "reason", "updated_at", "log_offsets",
)  # fmt: skip
"""The columns of `episodes` that change after a submit, besides `state`."""
_EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(Episode))
_SNAPSHOT_FIELDS = tuple(f.name for f in dataclasses.fields(SnapshotRecord))

MAX_REQUEST_ID = 200


@functools.lru_cache(maxsize=8192)
def _decode_spec(stored: str) -> EpisodeSpec:
    """A stored spec as an EpisodeSpec. A spec never changes once submitted and EpisodeSpec is
    frozen, so the control loop's passes over every live episode decode each one only once."""
    return codec.decode(EpisodeSpec, json.loads(stored), "spec")


def encode_spec(spec: EpisodeSpec) -> str:
    return json.dumps(codec.encode(spec), sort_keys=True)


def encode_labels(labels: Mapping[str, str]) -> str:
    return json.dumps(labels, sort_keys=True)


def episode_from_row(columns: Mapping[str, Any]) -> Episode:
    """An episode from its row, read back without validation: it was validated when submitted."""
    values = {name: columns[name] for name in _EPISODE_FIELDS}
    values["spec"] = _decode_spec(columns["spec"])
    values["state"] = EpisodeState(columns["state"])
    values["held"] = bool(columns["held"])
    values["log_offsets"] = tuple(json.loads(columns["log_offsets"]))
    return Episode(**values)


def checked_changes(changes: Mapping[str, Any]) -> Mapping[str, Any]:
    unknown = set(changes) - set(EPISODE_COLUMNS) - {"state"}
    if unknown:
        raise ValueError(f"not episode fields: {sorted(unknown)}")
    return changes


def transition_changes(
    current: Episode,
    to: EpisodeState,
    reason: str,
    expect: Collection[EpisodeState],
    snapshot: SnapshotRecord | None,
    changes: Mapping[str, Any],
    now: float,
) -> dict[str, Any]:
    """Every column a transition of `current` to `to` sets; FailedPrecondition if the state
    machine or `expect` refuses it. The caller's `changes` win over the derived ones."""
    if expect and current.state not in expect:
        raise FailedPrecondition(
            f"episode {current.id} is {current.state}, not {' or '.join(sorted(expect))}"
        )
    if to != current.state and to not in ALLOWED[current.state]:
        raise FailedPrecondition(f"episode {current.id} cannot go from {current.state} to {to}")
    derived: dict[str, Any] = {}
    if current.state == EpisodeState.RUNNING and to != EpisodeState.RUNNING and current.run_started_at:
        derived["run_seconds"] = current.run_seconds + (now - current.run_started_at)
        derived["run_started_at"] = 0.0
    if to in TERMINAL:
        derived["finished_at"] = now
    if snapshot is not None:
        derived["snapshots"] = current.snapshots + 1
        derived["last_snapshot_id"] = snapshot.id
    return {"state": str(to), "reason": reason, "updated_at": now, **derived, **changes}


def group_from_row(row: Mapping[str, Any]) -> Group:
    return Group(
        id=row["id"], task_id=row["task_id"], size=int(row["size"]), created_at=row["created_at"],
        max_staleness=None if row["max_staleness"] is None else int(row["max_staleness"]),
    )  # fmt: skip


def snapshot_row(s: SnapshotRecord) -> tuple[Any, ...]:
    """The values of a `snapshots` row, in column order."""
    return (
        s.id, s.episode_id, s.sequence, s.parent_id, s.node, s.reason, s.created_at,
        s.logical_bytes, s.stored_bytes, s.new_bytes, json.dumps(s.trajectory_cursor), json.dumps(s.timings_ms),
        s.manifest_digest,
    )  # fmt: skip


def snapshot_from_row(row: Mapping[str, Any]) -> SnapshotRecord:
    values = {name: row[name] for name in _SNAPSHOT_FIELDS}
    values["trajectory_cursor"] = json.loads(row["trajectory_cursor"])
    values["timings_ms"] = json.loads(row["timings_ms"])
    return SnapshotRecord(**values)


def node_row(node: NodeRecord, state: NodeState) -> tuple[Any, ...]:
    """The values of a `nodes` row, in column order."""
    return (
        node.name, node.address, str(state), node.backend, node.slots, node.memory_mb,
        json.dumps(node.images), json.dumps(node.labels), node.registered_at, node.disk_mb,
        node.restores_forks,
    )  # fmt: skip


def node_from_row(row: Mapping[str, Any]) -> NodeRecord:
    return NodeRecord(
        name=row["name"],
        address=row["address"],
        state=NodeState(row["state"]),
        backend=row["backend"],
        slots=row["slots"],
        memory_mb=row["memory_mb"],
        images=json.loads(row["images"]),
        labels=json.loads(row["labels"]),
        registered_at=row["registered_at"],
        disk_mb=row["disk_mb"],
        restores_forks=bool(row["restores_forks"]),
    )


def fingerprint(method: str, payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps([method, payload], sort_keys=True, default=str).encode()).hexdigest()


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument("request_id", f"must be at most {MAX_REQUEST_ID} characters")


def check_known_request(
    request_id: str, method: str, payload: Mapping[str, Any], row: Mapping[str, Any]
) -> str:
    """The target of the stored request `row`; Conflict if it was a different request."""
    if row["method"] != method or row["fingerprint"] != fingerprint(method, payload):
        raise Conflict(f"request_id {request_id!r} was already used for a different {row['method']} request")
    return str(row["target"])


def with_labels(episodes: list[Episode], labels: Mapping[str, str] | None) -> list[Episode]:
    """The episodes whose spec carries every one of `labels`."""
    if not labels:
        return episodes
    return [e for e in episodes if e.has_labels(labels)]
