"""An episode's turns as tree samples, the export a trainer takes to train on shared prefixes
once (the turns as `exports.ExportTurn`s, masked by `exports.ExportSettings`).

Turns are joined where a turn's prompt begins with its parent's prompt plus sampled ids exactly
and it was sampled with the same temperature, top-p and top-k (the rule that continues a
training sample, in `samples`); each set of turns so joined is one tree whose
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

The fork children of one snapshot export as one set of trees (`fork_tree_samples`): the turns
they share with their parent are one prefix of one tree, which every child's main path keeps,
so the prefix is trained once, with weight 1, and each child's own turns with the weight of the
paths holding them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.trajectory.edges import Edge
from orchestrator.trajectory.exports import DEFAULTS, ExportSettings, ExportTurn, masked, parent_of


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


def tree_samples(turns: Sequence[ExportTurn], settings: ExportSettings = DEFAULTS) -> TreeSamples:
    """The episode's trees as at most `settings.max_paths` streams each (see the module
    docstring)."""
    roots, children, masked_ids = _forest(turns, settings)
    mains = {root.id: [_main_path(root, children)] for root in roots}
    return _samples(roots, children, mains, masked_ids, settings.max_paths)


def fork_tree_samples(
    members: Sequence[Sequence[ExportTurn]], settings: ExportSettings = DEFAULTS
) -> TreeSamples:
    """The trees of the fork children of one snapshot (a GRPO group forked from a set-up, or a
    search's siblings) as one export: each member's turns as its trajectory reads them, the
    prefix it shares with the others included. A turn they share is one turn of one tree, so the
    shared prefix is trained once, with the tree's weights, and each member's own turns hang from
    it. Every member's main path is kept (its rollout), then, up to `settings.max_paths` paths a
    tree, those that add the most; a turn masked in any member's trajectory is masked."""
    merged: dict[int, ExportTurn] = {}
    hidden: set[int] = set()
    for turns in members:
        for t in turns:
            merged.setdefault(t.id, t)
            if masked(t, settings):
                hidden.add(t.id)
    roots, children, masked_ids = _forest(list(merged.values()), settings, hidden)
    by_id = {t.id: t for t in merged.values()}
    below = {root.id: root for root in roots}
    mains: dict[int, list[list[ExportTurn]]] = {root.id: [] for root in roots}
    for turns in members:
        own_roots, own_children, _ = _forest(turns, settings, hidden)
        for root in own_roots:
            path = [by_id[t.id] for t in _main_path(root, own_children)]
            if path and path[0].id in below and path not in mains[path[0].id]:
                mains[path[0].id].append(path)
    return _samples(roots, children, mains, masked_ids, settings.max_paths)


def _forest(
    turns: Sequence[ExportTurn], settings: ExportSettings, hidden: set[int] | None = None
) -> tuple[list[ExportTurn], dict[int, list[ExportTurn]], list[int]]:
    """The roots of the turns' trees, each turn's children joined to it, and the masked turns
    (those `settings` masks, and `hidden`)."""
    if settings.max_paths < 1:
        raise ValueError(f"max_paths must be at least 1, not {settings.max_paths}")
    ordered = sorted(turns, key=lambda t: t.id)
    hidden = hidden or set()
    masked_ids = [t.id for t in ordered if masked(t, settings) or t.id in hidden]
    left_out = set(masked_ids)
    usable = [t for t in ordered if t.id not in left_out and t.prompt_token_ids]
    by_id = {t.id: t for t in usable}
    children: dict[int, list[ExportTurn]] = {}
    roots: list[ExportTurn] = []
    for t in usable:
        parent = by_id.get(parent_of(t) or 0)
        if parent is not None and _joins(parent, t):
            children.setdefault(parent.id, []).append(t)
        else:
            roots.append(t)
    return roots, children, masked_ids


def _samples(
    roots: list[ExportTurn],
    children: Mapping[int, list[ExportTurn]],
    mains: Mapping[int, list[list[ExportTurn]]],
    masked_ids: list[int],
    max_paths: int,
) -> TreeSamples:
    """The trees' streams: each tree keeps its `mains` paths, then the paths that add the most,
    up to `max_paths` in all."""
    out = TreeSamples(streams=[], masked_turns=masked_ids)
    # Main's trees first, in its order across compactions.
    roots = sorted(roots, key=lambda r: (not any(mains[r.id]), r.id))
    for index, root in enumerate(roots):
        paths = _paths(root, children)
        kept = _keep(paths, [m for m in mains[root.id] if m], max_paths)
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


def _keep(paths: list[list[ExportTurn]], mains: list[list[ExportTurn]], cap: int) -> list[list[ExportTurn]]:
    kept: list[list[ExportTurn]] = list(mains)
    held = {t.id for main in mains for t in main}
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


_OFF_MAIN = frozenset({Edge.SIDE_CALL, Edge.SUBAGENT, Edge.COMPACTION, Edge.PARALLEL})


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
