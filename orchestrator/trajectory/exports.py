"""Exports a trainer takes as they are: an episode's turns as tree samples, as per-call records
for trie packing, and as an ATIF v1.8 trajectory.

Each is a pure function of the episode's turns: the ledger's `Turn`s, or the `TurnInfo`s a
client reads from `GetTrajectory` (both have the fields `ExportTurn` names).

**Masked turns.** An abandoned turn (the restored sandbox never had it) and a turn whose
delivery is uncertain are flagged and, by default (`ExportSettings`), masked: in no tree
sample, `masked` in the per-call records, and left out of the ATIF trajectory.

**Tree samples.** Turns are joined where a turn's prompt begins with its parent's prompt plus
sampled ids exactly and it was sampled with the same temperature, top-p and top-k (the rule
that continues a training sample, in `samples`); each set of turns so joined is one tree whose
paths share exact token prefixes. A break in the prompt, a change of sampling, or a root with
no recorded prefix starts a tree of its own. Each tree keeps at most `max_paths` of its
root-to-leaf paths, chosen in this order:

1. the main path, if the tree holds turns of main (`on_main`: branch 0 as the ledger's edges
   define it, never a side call, a subagent or a compaction's summary): from the root to its
   last turn of main, the live conversation (a leaf, unless abandoned turns are kept);
2. then, one at a time, the path that adds the most sampled tokens no kept path holds yet;
   a tie goes to the path whose leaf was recorded last, then to the lower branch.

A path adding no new sampled token is not kept. Each kept path is one stream: its last turn's
prompt plus sampled ids. A sampled token's weight is the fraction of the tree's kept paths that
contain it. Its loss mask is 1 in the first stream that holds it only, so that summing
`loss_mask * weight * token_loss` over a tree's streams gives the mean over its kept paths of
each path's summed loss, with each shared token trained once. Live turns on no kept path are
listed as dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from orchestrator.trajectory.edges import Edge

ATIF_VERSION = "ATIF-v1.8"


class ExportSampling(Protocol):
    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...


class ExportTurn(Protocol):
    """What an export reads of a turn."""

    @property
    def id(self) -> int: ...
    @property
    def parent_id(self) -> int | None:
        """None or 0: a root."""

    @property
    def branch(self) -> int: ...
    @property
    def run(self) -> int: ...
    @property
    def abandoned(self) -> bool: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def logprobs(self) -> Sequence[float]: ...
    @property
    def policy_version(self) -> str: ...
    @property
    def created_at(self) -> float: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def prefix_exact(self) -> bool | None: ...
    @property
    def logprobs_exact(self) -> bool: ...
    @property
    def sampling(self) -> ExportSampling: ...
    @property
    def delivery_uncertain(self) -> bool:
        """A delivery was under way when the orchestrator stopped and was never seen to end."""

    @property
    def edge(self) -> str:
        """How the turn hangs in the tree (`edges.Edge`); "" for a turn recorded before edges."""

    @property
    def edge_parent(self) -> int | None:
        """The turn it hangs from; None or 0: none."""


@dataclass(frozen=True)
class ExportSettings:
    """What the exports keep and mask."""

    max_paths: int = 5
    """Streams kept per tree: QwenGyre trains on at most 5 paths of a tree, and more paths of
    one tree add mostly shared context that costs compute for little new signal."""
    mask_abandoned: bool = True
    """Abandoned turns were never part of the conversation the sandbox went on with: training
    on them teaches a continuation the episode's reward does not score."""
    mask_uncertain: bool = True
    """A turn whose delivery is uncertain may or may not have reached the harness, so the reward
    may or may not follow from it (SkyRL leaves such turns out of training for the same reason)."""


def delivery_uncertain(turn: ExportTurn) -> bool:
    """Whether the ledger cannot tell if the turn reached the harness: a delivery of it was under
    way (the ledger's `sending_run` note) when the orchestrator stopped, and was never seen to end
    either way."""
    return turn.delivery_uncertain


def masked(turn: ExportTurn, settings: ExportSettings) -> bool:
    """The turn is left out of training (see the module docstring)."""
    return (settings.mask_abandoned and turn.abandoned) or (
        settings.mask_uncertain and delivery_uncertain(turn)
    )


def _parent(turn: ExportTurn) -> int | None:
    return turn.parent_id or None  # the API sends 0 for a root


# -- tree samples ---------------------------------------------------------------------------


@dataclass
class TreeStream:
    """One kept path of a tree as one token sequence."""

    tree: int
    """The tree's index in the episode: the trees holding turns of main first (main's turns after
    a compaction start a tree of their own), in the order of their roots, then the others."""
    path: int
    """The stream's rank among its tree's kept paths: 0 is the main path when the tree has it."""
    token_ids: list[int]
    loss_mask: list[int]
    """1 for a sampled token in the first stream of its tree that holds it; 0 elsewhere."""
    weights: list[float]
    """For each sampled token, the fraction of the tree's kept paths that contain it; 0 for
    context."""
    logprobs: list[float]
    """The behaviour log-prob of each sampled token; 0 for context."""
    policy_versions: list[str]
    """The policy version that sampled each token; "" for context."""
    turn_ids: list[int]
    """The turns of the path, root first."""
    edges: list[str]
    """Each turn's edge (`edges.Edge`: `side_call` flags a side call), per turn_ids entry."""
    spans: list[tuple[int, int]]
    """Where each turn's sampled tokens lie: [start, end) per turn_ids entry."""
    branch: int
    """The branch of the path's leaf."""
    logprobs_exact: bool


@dataclass
class TreeSamples:
    streams: list[TreeStream]
    dropped_turns: list[int] = field(default_factory=list)
    """Live turns on no kept path: their tree had more paths than `max_paths`."""
    masked_turns: list[int] = field(default_factory=list)
    """Turns left out as masked (abandoned, delivery uncertain)."""


def _joins(parent: ExportTurn, turn: ExportTurn) -> bool:
    """The turn's prompt is its parent's prompt plus sampled ids, then more, sampled alike."""
    if turn.prefix_exact is not True or _distribution(parent) != _distribution(turn):
        return False
    before = len(parent.prompt_token_ids)
    seen = before + len(parent.token_ids)
    prompt = list(turn.prompt_token_ids)
    return prompt[:before] == list(parent.prompt_token_ids) and prompt[before:seen] == list(parent.token_ids)


def _distribution(turn: ExportTurn) -> tuple[float, float, int]:
    s = turn.sampling
    return s.temperature, s.top_p, max(s.top_k, 0)


def tree_samples(turns: Sequence[ExportTurn], settings: ExportSettings = ExportSettings()) -> TreeSamples:
    """The episode's trees as at most `settings.max_paths` streams each (see the module
    docstring)."""
    if settings.max_paths < 1:
        raise ValueError(f"max_paths must be at least 1, not {settings.max_paths}")
    ordered = sorted(turns, key=lambda t: t.id)
    out = TreeSamples(streams=[], masked_turns=[t.id for t in ordered if masked(t, settings)])
    usable = [t for t in ordered if not masked(t, settings) and t.prompt_token_ids]
    by_id = {t.id: t for t in usable}
    children: dict[int, list[ExportTurn]] = {}
    roots: list[ExportTurn] = []
    for t in usable:
        parent = by_id.get(_parent(t) or 0)
        if parent is not None and _joins(parent, t):
            children.setdefault(parent.id, []).append(t)
        else:
            roots.append(t)
    mains = {root.id: _main_path(root, children) for root in roots}
    # Main's trees first, in its order across compactions.
    roots.sort(key=lambda r: (not mains[r.id], r.id))
    for index, root in enumerate(roots):
        paths = _paths(root, children)
        kept = _keep(paths, mains[root.id], settings.max_paths)
        on_kept = {t.id for p in kept for t in p}
        out.dropped_turns += sorted(t.id for p in paths for t in p if t.id not in on_kept)
        out.streams += _streams(index, kept)
    out.dropped_turns = sorted(set(out.dropped_turns))
    return out


def _paths(root: ExportTurn, children: Mapping[int, list[ExportTurn]]) -> list[list[ExportTurn]]:
    """Every root-to-leaf path, in the order of their leaves' ids."""
    paths: list[list[ExportTurn]] = []
    todo: list[list[ExportTurn]] = [[root]]
    while todo:
        path = todo.pop()
        below = children.get(path[-1].id, [])
        if not below:
            paths.append(path)
        todo += [[*path, c] for c in below]
    return sorted(paths, key=lambda p: p[-1].id)


def _keep(paths: list[list[ExportTurn]], main: list[ExportTurn], cap: int) -> list[list[ExportTurn]]:
    kept: list[list[ExportTurn]] = [main] if main else []
    held = {t.id for t in main}
    while len(kept) < cap:
        best: tuple[int, int, int] | None = None
        pick: list[ExportTurn] | None = None
        for p in paths:
            new = sum(len(t.token_ids) for t in p if t.id not in held)
            key = (new, p[-1].id, -p[-1].branch)
            if new and (best is None or key > best):
                best, pick = key, p
        if pick is None:
            break
        kept.append(pick)
        held |= {t.id for t in pick}
    return kept


_OFF_MAIN = frozenset({Edge.SIDE_CALL, Edge.SUBAGENT, Edge.COMPACTION, Edge.PARALLEL, Edge.FORK})


def on_main(turn: ExportTurn) -> bool:
    """The turn is main's, as the ledger's edges define it: of branch 0, which follows the primary
    conversation across compactions, and never a side call, a subagent, a compaction's summary or
    a parallel sibling (a turn recorded before edges were: of branch 0)."""
    return turn.branch == 0 and turn.edge not in _OFF_MAIN


def _main_path(root: ExportTurn, children: Mapping[int, list[ExportTurn]]) -> list[ExportTurn]:
    """The path from the root to the tree's last turn of main; empty if it has none."""
    parent_of: dict[int, ExportTurn] = {}
    last: ExportTurn | None = None
    todo = [root]
    while todo:
        t = todo.pop()
        if on_main(t) and (last is None or t.id > last.id):
            last = t
        for c in children.get(t.id, []):
            parent_of[c.id] = t
            todo.append(c)
    path = []
    while last is not None:
        path.append(last)
        last = parent_of.get(last.id)
    return path[::-1]


def _streams(tree: int, kept: list[list[ExportTurn]]) -> list[TreeStream]:
    share: dict[int, int] = {}
    for p in kept:
        for t in p:
            share[t.id] = share.get(t.id, 0) + 1
    trained: set[int] = set()
    streams = []
    for rank, p in enumerate(kept):
        leaf = p[-1]
        tokens = [*leaf.prompt_token_ids, *leaf.token_ids]
        n = len(tokens)
        mask, weights, logprobs, versions = [0] * n, [0.0] * n, [0.0] * n, [""] * n
        spans = []
        for t in p:
            start = len(t.prompt_token_ids)
            end = start + len(t.token_ids)
            spans.append((start, end))
            weights[start:end] = [share[t.id] / len(kept)] * len(t.token_ids)
            logprobs[start:end] = list(t.logprobs)
            versions[start:end] = [t.policy_version] * len(t.token_ids)
            if t.id not in trained:
                mask[start:end] = [1] * len(t.token_ids)
                trained.add(t.id)
        streams.append(
            TreeStream(
                tree=tree, path=rank, token_ids=tokens, loss_mask=mask, weights=weights,
                logprobs=logprobs, policy_versions=versions, turn_ids=[t.id for t in p], edges=[t.edge for t in p], spans=spans,
                branch=leaf.branch, logprobs_exact=all(t.logprobs_exact for t in p),
            )
        )  # fmt: skip
    return streams


# -- per-call records -----------------------------------------------------------------------


@dataclass
class CallRecord:
    """One model call, exactly as sampled: the prompt it was conditioned on, what it sampled and
    the call it continues. Calls whose prompts share a prefix pack into one trie."""

    turn_id: int
    parent_id: int | None
    edge: str
    """How the call hangs in the tree (`edges.Edge`: `side_call` flags a side call)."""
    edge_parent: int | None
    """The call it hangs from: a subagent's spawning call, a continued conversation's compaction."""
    branch: int
    run: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    """The behaviour log-prob of each completion token."""
    policy_version: str
    finish_reason: str
    mode: str
    prefix_exact: bool | None
    """The prompt begins with the parent's prompt plus completion ids; None when not checked."""
    logprobs_exact: bool
    created_at: float
    abandoned: bool
    delivery_uncertain: bool
    masked: bool
    """Left out of training by the export's settings (abandoned, or delivery uncertain)."""


def call_records(
    turns: Sequence[ExportTurn], settings: ExportSettings = ExportSettings()
) -> list[CallRecord]:
    """Every turn of the episode as a call record, in the order recorded (a parent first)."""
    return [_record(t, settings) for t in sorted(turns, key=lambda t: t.id)]


def _record(t: ExportTurn, settings: ExportSettings) -> CallRecord:
    return CallRecord(
        turn_id=t.id, parent_id=_parent(t), edge=t.edge, edge_parent=t.edge_parent or None, branch=t.branch, run=t.run,
        prompt_token_ids=list(t.prompt_token_ids), completion_token_ids=list(t.token_ids),
        logprobs=list(t.logprobs), policy_version=t.policy_version, finish_reason=t.finish_reason,
        mode=t.mode, prefix_exact=t.prefix_exact, logprobs_exact=t.logprobs_exact,
        created_at=t.created_at, abandoned=t.abandoned, delivery_uncertain=delivery_uncertain(t),
        masked=masked(t, settings),
    )  # fmt: skip


# -- ATIF -----------------------------------------------------------------------------------


def atif(
    episode_id: str,
    turns: Sequence[ExportTurn],
    *,
    reward: float | None = None,
    labels: Mapping[str, str] | None = None,
    agent_version: str = "",
    settings: ExportSettings = ExportSettings(),
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
    return turn.edge_parent or _parent(turn)


def _carries_on(turn: ExportTurn) -> bool:
    """It carries a conversation on after a compaction: a continuation whose prompt extends no
    recorded turn."""
    return turn.edge == Edge.CONTINUATION and _parent(turn) is None


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
                    "parent_id": _parent(t),
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
