"""An episode's turns as ATIF v1.8 trajectory documents (the Agent Trajectory Interchange
Format), each validated by the `atif` package's models; how branches, subagents and compactions
become trajectories is in `atif`'s docstring. Masked turns (`exports.masked`) are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from orchestrator.trajectory.edges import Edge
from orchestrator.trajectory.exports import (
    DEFAULTS,
    ExportSettings,
    ExportTurn,
    delivery_uncertain,
    masked,
    parent_of,
)

ATIF_VERSION = "ATIF-v1.8"


def atif(
    episode_id: str,
    turns: Sequence[ExportTurn],
    *,
    reward: float | None = None,
    labels: Mapping[str, str] | None = None,
    agent_version: str = "",
    settings: ExportSettings = DEFAULTS,
) -> list[dict[str, Any]]:
    """The episode as ATIF v1.8 trajectory documents, each validated by the `atif` package's
    models: main's trajectory first, then the ones it continues into after compactions, if any.

    Every branch is a trajectory, one agent step per turn with its prompt and completion token
    ids and log-probs; branch 0 (main) is the episode's (`<episode>`), every other an embedded
    subagent trajectory (`<episode>/branch-<n>`). Where a branch's conversation carries on after a
    compaction (a continuation with no recorded prompt prefix), the rest of it is a trajectory of
    its own (`<trajectory>/continued-<k>`), named by the one before's `continued_trajectory_ref`:
    main's are further documents, a subagent's sit beside it. A compaction's summary call is a
    step of the trajectory it summarises. Any other branch is embedded in the trajectory holding
    the turn it hangs from (by its edge: a subagent's spawning turn, else its prompt's parent),
    whose step names it in an observation's `subagent_trajectory_ref`; one that hangs from no
    kept turn (a side call, a subagent whose spawning call could not be told) is embedded in the
    episode's, named by no step. Every step's `extra` has its turn, its parent, its edge and
    what the edge hangs from, its branch and run, and its `policy_version`; every embedded
    trajectory's has its branch and edge (`side_call` flags a side call); the episode's has the
    reward, the labels and the policy versions in order of first use. Masked turns are left out.
    """
    from atif import Trajectory  # the pydantic models are needed only when this export is asked for

    kept = [t for t in sorted(turns, key=lambda t: t.id) if not masked(t, settings)]
    doc_of: dict[int, str] = {}
    """Each kept turn's trajectory id."""
    parts: dict[str, list[ExportTurn]] = {episode_id: []}
    """Each trajectory's turns, the trajectories in the order of their first turns."""
    continues: dict[str, str] = {}
    """A trajectory -> the one it continues after a compaction."""
    current: dict[int, str] = {}
    """Each branch's trajectory so far."""
    for t in kept:
        key = current.get(t.branch)
        if key is None:
            summarised = doc_of.get(t.edge_parent or 0) if t.edge == Edge.COMPACTION else None
            key = summarised or (episode_id if t.branch == 0 else f"{episode_id}/branch-{t.branch}")
        elif _carries_on(t):
            before, base = key, key.partition("/continued-")[0]
            key = f"{base}/continued-{sum(k.startswith(f'{base}/continued-') for k in parts) + 1}"
            continues[key] = before
        current[t.branch] = key
        doc_of[t.id] = key
        parts.setdefault(key, []).append(t)
    version = agent_version or "unknown"
    docs = {key: _atif_document(episode_id, key, ts, version) for key, ts in parts.items()}
    step_of = {t.id: i for ts in parts.values() for i, t in enumerate(ts)}
    main = docs[episode_id]
    chain = [main]
    host_of: dict[str, dict[str, Any]] = {}
    """An embedded trajectory -> the trajectory it is embedded in."""
    for key, ts in parts.items():
        if key == episode_id:
            continue
        doc, first = docs[key], ts[0]
        doc["extra"] = {"branch": first.branch, "edge": first.edge}
        earlier = continues.get(key)
        if earlier is not None:
            docs[earlier]["continued_trajectory_ref"] = key
            if earlier not in host_of:  # main's: a document of its own
                chain.append(doc)
                continue
            host = host_of[earlier]  # beside the trajectory it continues
        else:
            anchor = _anchor(first) or 0
            host_key = doc_of.get(anchor)
            host = main if host_key is None else docs[host_key]
            if host_key is not None:  # named by the step it hangs from
                ref = {"trajectory_id": key, "session_id": episode_id}
                step = host["steps"][step_of[anchor]]
                step.setdefault("observation", {"results": []})["results"].append(
                    {"subagent_trajectory_ref": [ref]}
                )
        host.setdefault("subagent_trajectories", []).append(doc)
        host_of[key] = host
    main["extra"] = {
        "episode_id": episode_id,
        "reward": reward,
        "labels": dict(labels or {}),
        "policy_versions": list(dict.fromkeys(t.policy_version for t in kept if t.policy_version)),
    }
    return [Trajectory.model_validate(doc).to_json_dict() for doc in chain]


def _anchor(turn: ExportTurn) -> int | None:
    """The turn it hangs from: its edge's (a subagent's spawning turn, a continued conversation's
    compaction), else its prompt's parent (a turn recorded before edges were)."""
    return turn.edge_parent or parent_of(turn)


def _carries_on(turn: ExportTurn) -> bool:
    """It carries a conversation on after a compaction: a continuation whose prompt extends no
    recorded turn."""
    return turn.edge == Edge.CONTINUATION and parent_of(turn) is None


def _atif_document(
    episode_id: str, trajectory_id: str, turns: list[ExportTurn], version: str
) -> dict[str, Any]:
    steps = []
    for i, t in enumerate(turns, start=1):
        steps.append(
            {
                "step_id": i,
                "timestamp": datetime.fromtimestamp(t.created_at, UTC).isoformat(),
                "source": "agent",
                "message": "",
                "llm_call_count": 1,
                "metrics": {
                    "prompt_tokens": len(t.prompt_token_ids),
                    "completion_tokens": len(t.token_ids),
                    "prompt_token_ids": list(t.prompt_token_ids),
                    "completion_token_ids": list(t.token_ids),
                    "logprobs": list(t.logprobs),
                },
                "extra": {
                    "turn_id": t.id,
                    "parent_id": parent_of(t),
                    "edge": t.edge,
                    "edge_parent": t.edge_parent or None,
                    "branch": t.branch,
                    "run": t.run,
                    "policy_version": t.policy_version,
                    "finish_reason": t.finish_reason,
                    "abandoned": t.abandoned,
                    "delivery_uncertain": delivery_uncertain(t),
                    "logprobs_exact": t.logprobs_exact,
                },
            }
        )
    return {
        "schema_version": ATIF_VERSION,
        "session_id": episode_id,
        "trajectory_id": trajectory_id,
        "agent": {"name": "stasis", "version": version},
        "steps": steps,
    }
