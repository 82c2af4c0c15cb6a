"""Exports a trainer takes as they are: tree samples with their path cap and per-token weights on a
tree whose answer is known, per-call records with their parent links and edges, ATIF v1.8
validated by the `atif` models (a compaction's continuation, a subagent linked to its spawning
step, a side call flagged), and a dataset written by `stasis trajectories export`, by labels,
time or GRPO group, that round-trips through pyarrow. Abandoned turns and turns whose delivery is
uncertain are flagged and masked unless asked for. The orchestrator's client is a boundary fake
(`_Client`), named as such."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import atif
import pyarrow.parquet as pq
import pytest

from orchestrator.api.messages import branch_to_pb
from orchestrator.cli.datasets import export
from orchestrator.cli.parser import parser
from orchestrator.client import TrajectoryInfo
from orchestrator.domain import InvalidArgument, NotFound
from orchestrator.trajectory import (
    Branch,
    CanonicalRequest,
    ExportSettings,
    Ledger,
    Turn,
    call_records,
    tree_samples,
)
from orchestrator.trajectory import (
    atif as atif_export,
)
from orchestrator.trajectory.canonical import canonical_message
from orchestrator.trajectory.dataset import SCHEMAS, rows, write
from orchestrator.trajectory.turns import extension
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb


def _turn(
    turn_id: int, sampled: list[int], parent: Turn | None = None, branch: int = 0, **fields: Any
) -> Turn:
    """A turn whose prompt is its parent's prompt plus sampled ids, then one token of its own."""
    prompt = fields.pop("prompt", None) or (
        [*parent.prompt_token_ids, *parent.token_ids, 100 + turn_id] if parent else [1, 2]
    )
    base: dict[str, Any] = dict(
        id=turn_id, episode_id="ep", parent_id=parent.id if parent else None, branch=branch, run=1,
        kind="chat", request_raw=b"", response=b"", protocol="chat", delivered=b"", delivered_run=1,
        delivered_at=None, token_ids=sampled, logprobs=[-0.25] * len(sampled), prompt_token_ids=prompt,
        policy_version=f"v{turn_id}", abandoned=False, replays=0, created_at=1_760_000_000.0 + turn_id,
        lineage=extension(parent, prompt), logprobs_mode="processed",
    )  # fmt: skip
    base.update(fields)
    return Turn(**base)


def _tree() -> list[Turn]:
    """The known tree (sampled tokens in brackets):

    t1 [10 11] ─ t2 [12] ─ t3 [13 14]            main (branch 0)
              │         ├ t5 [30]                parallel call (branch 2)
              │         └ t3 ─ t8 [60..65]       abandoned after a restore (branch 4)
              ├ t4 [20 21 22] ─ t6 [40..43]      subagent on the shared prefix (branch 1)
              └ t7 [50]                          side call (branch 3)
    t9 [90]                                      a root with no recorded prefix (branch 5)
    """
    t1 = _turn(1, [10, 11])
    t2 = _turn(2, [12], t1)
    t3 = _turn(3, [13, 14], t2)
    t4 = _turn(4, [20, 21, 22], t1, branch=1)
    t5 = _turn(5, [30], t2, branch=2)
    t6 = _turn(6, [40, 41, 42, 43], t4, branch=1)
    t7 = _turn(7, [50], t1, branch=3)
    t8 = _turn(8, [60, 61, 62, 63, 64, 65], t3, branch=4, abandoned=True, run=2)
    t9 = _turn(9, [90], None, branch=5, prompt=[7, 7, 7])
    return [t1, t2, t3, t4, t5, t6, t7, t8, t9]


def _weights(stream: Any) -> dict[int, float]:
    """The weight of each turn's sampled tokens in a stream, by turn id."""
    out = {}
    for turn_id, (start, end) in zip(stream.turn_ids, stream.spans, strict=True):
        assert len(set(stream.weights[start:end])) == 1
        out[turn_id] = stream.weights[start:end][0]
    return out


@pytest.mark.timeout(10)
def test_tree_samples_keep_main_then_the_paths_that_add_most_and_weight_tokens_by_paths() -> None:
    result = tree_samples(_tree(), ExportSettings(max_paths=3))
    first, second = [s for s in result.streams if s.tree == 0], [s for s in result.streams if s.tree == 1]
    # Main first; then t4-t6 adds 7 new sampled tokens; t5 and t7 add 1 each, and t7 was recorded last.
    assert [s.turn_ids for s in first] == [[1, 2, 3], [1, 4, 6], [1, 7]]
    assert [s.path for s in first] == [0, 1, 2]
    assert result.dropped_turns == [5] and result.masked_turns == [8]
    assert [_weights(s) for s in first] == [
        {1: 1.0, 2: 1 / 3, 3: 1 / 3},
        {1: 1.0, 4: 1 / 3, 6: 1 / 3},
        {1: 1.0, 7: 1 / 3},
    ]
    main = first[0]
    t3 = _tree()[2]
    assert main.token_ids == [*t3.prompt_token_ids, *t3.token_ids]
    assert main.loss_mask == [0, 0, 1, 1, 0, 1, 0, 1, 1]
    assert main.weights == [0, 0, 1, 1, 0, 1 / 3, 0, 1 / 3, 1 / 3]
    assert main.policy_versions == ["", "", "v1", "v1", "", "v2", "", "v3", "v3"]
    # t1's tokens are trained once, in the main stream; the others hold them as context.
    for s in first[1:]:
        start, end = s.spans[0]
        assert s.loss_mask[start:end] == [0, 0] and s.weights[start:end] == [1.0, 1.0]
    # Summed over streams, mask * weight gives each kept path's sampled tokens 1/3 each.
    per_path = sum(m * w for s in first for m, w in zip(s.loss_mask, s.weights, strict=True))
    assert per_path == pytest.approx((2 + 1 + 2) / 3 + (2 + 3 + 4) / 3 + (2 + 1) / 3)
    # The root without a recorded prefix is a tree of its own.
    assert [(s.turn_ids, s.weights, s.loss_mask) for s in second] == [([9], [0, 0, 0, 1.0], [0, 0, 0, 1])]


@pytest.mark.timeout(10)
def test_the_path_cap_defaults_to_five_and_one_keeps_main_alone() -> None:
    every = tree_samples(_tree())
    assert [s.turn_ids for s in every.streams if s.tree == 0] == [[1, 2, 3], [1, 4, 6], [1, 7], [1, 2, 5]]
    assert every.dropped_turns == []
    assert _weights(every.streams[3]) == {1: 1.0, 2: 0.5, 5: 0.25}
    alone = tree_samples(_tree(), ExportSettings(max_paths=1))
    assert [s.turn_ids for s in alone.streams] == [[1, 2, 3], [9]]
    assert alone.streams[0].weights[2:4] == [1.0, 1.0] and alone.dropped_turns == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="max_paths"):
        tree_samples(_tree(), ExportSettings(max_paths=0))


@pytest.mark.timeout(10)
def test_abandoned_turns_are_masked_unless_kept_and_main_still_leads() -> None:
    kept = tree_samples(_tree(), ExportSettings(max_paths=5, mask_abandoned=False))
    first = [s.turn_ids for s in kept.streams if s.tree == 0]
    # Main ends at t3 although t3 now has a child; t8's path adds 6 sampled tokens, after t4-t6's 7.
    assert first == [[1, 2, 3], [1, 4, 6], [1, 2, 3, 8], [1, 7], [1, 2, 5]]
    assert kept.masked_turns == [] and _weights(kept.streams[2])[3] == 2 / 5


@pytest.mark.timeout(10)
def test_a_break_or_a_change_of_sampling_starts_a_tree() -> None:
    t1 = _turn(1, [10])
    t2 = _turn(2, [11], t1, prompt=[1, 2, 99, 5])  # re-rendered: leaves the sampled tokens
    t3 = _turn(3, [12], t2)
    assert t2.prefix_exact is False
    result = tree_samples([t1, t2, t3])
    assert [(s.tree, s.turn_ids) for s in result.streams] == [(0, [1]), (1, [2, 3])]


@pytest.mark.timeout(10)
def test_call_records_hold_exact_ids_and_parent_links_and_flag_masked_calls() -> None:
    records = call_records(_tree())
    assert [(r.turn_id, r.parent_id) for r in records] == [
        (1, None), (2, 1), (3, 2), (4, 1), (5, 2), (6, 4), (7, 1), (8, 3), (9, None)
    ]  # fmt: skip
    t6 = _tree()[5]
    r6 = records[5]
    assert r6.prompt_token_ids == t6.prompt_token_ids and r6.completion_token_ids == [40, 41, 42, 43]
    assert r6.logprobs == [-0.25] * 4 and r6.policy_version == "v6" and not r6.masked
    assert [r.turn_id for r in records if r.masked] == [8] and records[7].abandoned
    assert not any(r.delivery_uncertain for r in records)
    assert not any(r.masked for r in call_records(_tree(), ExportSettings(mask_abandoned=False)))


def _chat(*texts: str) -> CanonicalRequest:
    roles = ("user", "assistant")
    return CanonicalRequest.parse(
        "chat",
        {"model": "m", "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]},
    )


@pytest.mark.timeout(30)
def test_a_restore_divergence_in_a_real_ledger_is_masked_from_the_exports(tmp_path: Path) -> None:
    ledger = Ledger.sqlite(tmp_path / "state.db")
    try:

        def record(
            request: CanonicalRequest, answer: str, prompt: list[int], sampled: list[int], **kw: Any
        ) -> Turn:
            return ledger.record(
                "ep", kw.pop("run", 1), kw.pop("resumed_at", 0.0), request,
                answer=canonical_message({"role": "assistant", "content": answer}), request_raw=b"{}",
                response=b"", protocol="chat", delivered=b"", token_ids=sampled, logprobs=[-0.5] * len(sampled),
                prompt_token_ids=prompt, policy_version="v1", upstream_ms=1.0,
            )  # fmt: skip

        a = record(_chat("hi"), "a", [1, 2], [5, 6, 7])
        b = record(_chat("hi", "a", "more"), "b", [1, 2, 5, 6, 7, 8], [20])
        p = record(_chat("hi", "a", "other"), "p", [1, 2, 5, 6, 7, 9], [30])
        ledger.delivered(a.id, 10.0)
        assert ledger.replay("ep", 2, _chat("hi")) is not None
        # Restored from a snapshot taken at 20: b and p never reached the harness, which goes another way.
        c = ledger.record(
            "ep", 2, 20.0, _chat("hi", "a", "different"),
            answer=canonical_message({"role": "assistant", "content": "c"}), request_raw=b"{}", response=b"",
            protocol="chat", delivered=b"", token_ids=[40], logprobs=[-0.5], prompt_token_ids=[1, 2, 5, 6, 7, 10],
            policy_version="v2", upstream_ms=1.0,
        )  # fmt: skip
        turns = ledger.turns("ep")
    finally:
        ledger.close()
    assert [t.id for t in turns if t.abandoned] == [b.id, p.id]
    result = tree_samples(turns)
    assert [s.turn_ids for s in result.streams] == [[a.id, c.id]] and result.masked_turns == [b.id, p.id]
    assert result.streams[0].weights == [0, 0, 1.0, 1.0, 1.0, 0, 1.0]
    kept = tree_samples(turns, ExportSettings(mask_abandoned=False))
    assert [s.turn_ids for s in kept.streams] == [[a.id, c.id], [a.id, p.id], [a.id, b.id]]
    assert [(r.turn_id, r.masked) for r in call_records(turns)] == [
        (a.id, False), (b.id, True), (p.id, True), (c.id, False)
    ]  # fmt: skip
    (doc,) = atif_export("ep", turns)
    trajectory = atif.Trajectory.model_validate(doc)
    assert [s.extra["turn_id"] for s in trajectory.steps if s.extra] == [a.id, c.id]
    assert trajectory.subagent_trajectories is None and trajectory.extra
    assert trajectory.extra["policy_versions"] == ["v1", "v2"]


def _trajectory_info(turns: list[Turn], group_id: str = "", group_index: int = 0) -> TrajectoryInfo:
    """The trajectory as a client reads it from GetTrajectory."""
    by_branch: dict[int, list[Turn]] = {}
    for t in turns:
        by_branch.setdefault(t.branch, []).append(t)
    branches = [
        branch_to_pb(Branch(b, ts, all(t.abandoned for t in ts))) for b, ts in sorted(by_branch.items())
    ]
    message = pb.Trajectory(
        episode_id="ep",
        state=pb.EPISODE_STATE_SUCCEEDED,
        main=branches[0],
        branches=branches[1:],
        has_reward=True,
        reward=0.75,
        labels={"task": "t"},
        group_id=group_id,
        group_index=group_index,
    )
    return wire.decode(message, TrajectoryInfo)


@pytest.mark.timeout(10)
def test_a_turn_whose_delivery_is_uncertain_is_flagged_and_masked_unless_kept() -> None:
    tree = _tree()
    tree[5] = _turn(6, [40, 41, 42, 43], tree[3], branch=1, sending_run=1, sending_at=1_760_000_006.5)
    for turns in (tree, _client_turns(tree)):
        records = call_records(turns)
        assert [(r.turn_id, r.delivery_uncertain, r.masked) for r in records if r.masked] == [
            (6, True, True), (8, False, True)
        ]  # fmt: skip
        result = tree_samples(turns)
        assert result.masked_turns == [6, 8]
        assert [s.turn_ids for s in result.streams if s.tree == 0] == [[1, 2, 3], [1, 4], [1, 7], [1, 2, 5]]
        (doc,) = atif_export("ep", turns)
        assert [s["extra"]["turn_id"] for s in doc["subagent_trajectories"][0]["steps"]] == [4]
        kept = call_records(turns, ExportSettings(mask_abandoned=False, mask_uncertain=False))
        assert [r.turn_id for r in kept if r.delivery_uncertain] == [6] and not any(r.masked for r in kept)


def _client_turns(turns: list[Turn]) -> list[Any]:
    info = _trajectory_info(turns)
    return [t for b in [info.main, *info.branches] for t in b.turns]


@pytest.mark.timeout(10)
def test_the_exports_read_the_turns_a_client_gets_as_they_read_the_ledgers() -> None:
    info = _trajectory_info(_tree())
    turns = [t for b in [info.main, *info.branches] for t in b.turns]
    assert tree_samples(turns) == tree_samples(_tree())
    assert call_records(turns) == call_records(_tree())


@pytest.mark.timeout(10)
def test_atif_validates_with_the_atif_models_and_links_subagents() -> None:
    (doc,) = atif_export("ep", _tree(), reward=0.75, labels={"task": "t"}, agent_version="0.1.0")
    trajectory = atif.Trajectory.model_validate(doc)
    assert trajectory.schema_version == "ATIF-v1.8" and trajectory.trajectory_id == "ep"
    assert [s.extra["turn_id"] for s in trajectory.steps if s.extra] == [1, 2, 3]
    step1 = trajectory.steps[0]
    assert step1.metrics is not None and step1.metrics.completion_token_ids == [10, 11]
    assert step1.metrics.prompt_token_ids == [1, 2] and step1.metrics.logprobs == [-0.25, -0.25]
    assert step1.extra is not None and step1.extra["policy_version"] == "v1"
    assert trajectory.extra == {"episode_id": "ep", "reward": 0.75, "labels": {"task": "t"},
                                "policy_versions": ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v9"]}  # fmt: skip
    # t4's branch and t7's hang off step 1, t5's off step 2; t9 has no recorded prefix; t8 is masked.
    embedded = trajectory.subagent_trajectories or []
    assert [s.trajectory_id for s in embedded] == ["ep/branch-1", "ep/branch-2", "ep/branch-3", "ep/branch-5"]

    def refs(step: atif.Step) -> list[str | None]:
        results = step.observation.results if step.observation else []
        return [ref.trajectory_id for r in results for ref in r.subagent_trajectory_ref or []]

    assert [refs(s) for s in trajectory.steps] == [["ep/branch-1", "ep/branch-3"], ["ep/branch-2"], []]
    assert [s.extra["turn_id"] for s in embedded[0].steps if s.extra] == [4, 6]
    assert trajectory.continued_trajectory_ref is None


def _typed_tree() -> list[Turn]:
    """A tree whose edges the ledger typed, as Claude Code makes one (sampled tokens in brackets):

    t1 [50]                                     side call: a title, recorded first (branch 1)
    t2 [10 11] ─ t3 [12]                        main (branch 0); t3's tool call spawns t4
                       └ t6 [60 61]             compaction of main, hung from t3 (branch 3)
    t4 [40 41] ─ t5 [42]                        subagent spawned by t3, no shared prefix (branch 2)
    t7 [70] ─ t8 [71 72]                        main continued from t6's summary (branch 0); t8's
                                                delivery was under way when the orchestrator stopped
    """
    t1 = _turn(1, [50], branch=1, prompt=[7, 7], edge="side_call")
    t2 = _turn(2, [10, 11], edge="root")
    t3 = _turn(3, [12], t2, edge="continuation", edge_parent=2)
    t4 = _turn(4, [40, 41], branch=2, prompt=[5, 5], edge="subagent", edge_parent=3)
    t5 = _turn(5, [42], t4, branch=2, edge="continuation", edge_parent=4)
    t6 = _turn(6, [60, 61], t3, branch=3, edge="compaction", edge_parent=3)
    t7 = _turn(7, [70], prompt=[3, 3], edge="continuation", edge_parent=6)
    t8 = _turn(8, [71, 72], t7, edge="continuation", edge_parent=7, sending_run=1, sending_at=1_760_000_008.5)
    return [t1, t2, t3, t4, t5, t6, t7, t8]


@pytest.mark.timeout(10)
def test_the_tree_export_leads_with_main_across_a_compaction_and_names_each_turns_edge() -> None:
    for turns in (_typed_tree(), _client_turns(_typed_tree())):
        result = tree_samples(turns)
        assert [(s.tree, s.path, s.turn_ids, s.edges) for s in result.streams] == [
            (0, 0, [2, 3], ["root", "continuation"]),
            (0, 1, [2, 3, 6], ["root", "continuation", "compaction"]),
            (1, 0, [7], ["continuation"]),
            (2, 0, [1], ["side_call"]),
            (3, 0, [4, 5], ["subagent", "continuation"]),
        ]
        assert result.masked_turns == [8] and result.dropped_turns == []
        assert [(s.weights, s.loss_mask) for s in result.streams[:2]] == [
            ([0, 0, 1.0, 1.0, 0, 1.0], [0, 0, 1, 1, 0, 1]),
            ([0, 0, 1.0, 1.0, 0, 1.0, 0, 0.5, 0.5], [0, 0, 0, 0, 0, 0, 0, 1, 1]),
        ]
        kept = tree_samples(turns, ExportSettings(mask_uncertain=False))
        assert [s.turn_ids for s in kept.streams if s.tree == 1] == [[7, 8]] and kept.masked_turns == []


@pytest.mark.timeout(10)
def test_call_records_carry_each_calls_edge_and_flag_the_uncertain_delivery() -> None:
    for turns in (_typed_tree(), _client_turns(_typed_tree())):
        assert [
            (r.turn_id, r.parent_id, r.edge, r.edge_parent, r.delivery_uncertain, r.masked)
            for r in call_records(turns)
        ] == [
            (1, None, "side_call", None, False, False),
            (2, None, "root", None, False, False),
            (3, 2, "continuation", 2, False, False),
            (4, None, "subagent", 3, False, False),
            (5, 4, "continuation", 4, False, False),
            (6, 3, "compaction", 3, False, False),
            (7, None, "continuation", 6, False, False),
            (8, 7, "continuation", 7, True, True),
        ]


def _refs(step: dict[str, Any]) -> list[str]:
    results = (step.get("observation") or {}).get("results") or []
    return [ref["trajectory_id"] for r in results for ref in r.get("subagent_trajectory_ref") or []]


@pytest.mark.timeout(10)
def test_atif_continues_main_after_a_compaction_links_the_subagent_and_flags_the_side_call() -> None:
    for turns in (_typed_tree(), _client_turns(_typed_tree())):
        main, after = atif_export("ep", turns, reward=1.0)
        for doc in (main, after):
            atif.Trajectory.model_validate(doc)
        # The compaction's summary call ends the trajectory it summarises, which continues into t7's.
        assert [(s["extra"]["turn_id"], s["extra"]["edge"]) for s in main["steps"]] == [
            (2, "root"), (3, "continuation"), (6, "compaction")
        ]  # fmt: skip
        assert main["trajectory_id"] == "ep" and main["continued_trajectory_ref"] == "ep/continued-1"
        assert after["trajectory_id"] == "ep/continued-1" and "continued_trajectory_ref" not in after
        assert [s["extra"]["turn_id"] for s in after["steps"]] == [7]  # t8 is masked
        assert after["steps"][0]["extra"]["edge_parent"] == 6
        # The subagent hangs from t3, the step whose tool call spawned it; the side call from none.
        assert [_refs(s) for s in main["steps"]] == [[], ["ep/branch-2"], []]
        embedded = main["subagent_trajectories"]
        assert [(d["trajectory_id"], d["extra"]) for d in embedded] == [
            ("ep/branch-1", {"branch": 1, "edge": "side_call"}),
            ("ep/branch-2", {"branch": 2, "edge": "subagent"}),
        ]
        assert [[s["extra"]["turn_id"] for s in d["steps"]] for d in embedded] == [[1], [4, 5]]
        assert main["extra"]["policy_versions"] == ["v1", "v2", "v3", "v4", "v5", "v6", "v7"]
        _, kept = atif_export("ep", turns, settings=ExportSettings(mask_uncertain=False))
        assert [(s["extra"]["turn_id"], s["extra"]["delivery_uncertain"]) for s in kept["steps"]] == [
            (7, False), (8, True)
        ]  # fmt: skip


@pytest.mark.timeout(10)
def test_a_subagents_conversation_after_its_compaction_sits_beside_it() -> None:
    tree = _typed_tree()[1:6]  # main up to its compaction, and the subagent t4-t5
    t9 = _turn(9, [43], tree[3], branch=4, edge="compaction", edge_parent=5)
    t10 = _turn(10, [44], branch=2, prompt=[6, 6], edge="continuation", edge_parent=9)
    (main,) = atif_export("ep", [*tree, t9, t10])
    subagent, continued = main["subagent_trajectories"]
    assert [s["extra"]["turn_id"] for s in subagent["steps"]] == [4, 5, 9]
    assert subagent["continued_trajectory_ref"] == continued["trajectory_id"] == "ep/branch-2/continued-1"
    assert [s["extra"]["turn_id"] for s in continued["steps"]] == [10]
    assert [_refs(s) for s in main["steps"]] == [[], ["ep/branch-2"], []]


_MEMBERS = {"late": 0, "ep": 1, "running": 2}
"""GRPO group g's members: `running` is not finished."""


class _Client:
    """A boundary fake of the orchestrator's client, which the export takes: two finished episodes
    whose trajectories are the known tree as GetTrajectory sends it, members 1 and 0 of group g,
    whose member 2 still runs."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.said: list[str] = []

    def episodes(self, states: Sequence[str] = (), labels: dict[str, str] | None = None) -> list[Any]:
        self.asked.append({"states": list(states), "labels": labels})
        return [
            SimpleNamespace(id=e, finished_at=at, forked_from="", fork_parent="")
            for e, at in (("ep", 100.0), ("late", 200.0))
        ]

    def groups(self, group_id: str = "") -> list[Any]:
        if group_id not in ("", "g"):
            raise NotFound(f"no group {group_id}")
        members = [SimpleNamespace(index=i, episode_id=e) for e, i in _MEMBERS.items()]
        return [SimpleNamespace(id="g", size=3, final=2, members=members)]

    def trajectory(self, episode_id: str, include_branches: bool = False) -> TrajectoryInfo:
        assert include_branches
        return _trajectory_info(_tree(), "g", _MEMBERS[episode_id])


def _export(*argv: str) -> tuple[_Client, Path, int, int]:
    client = _Client()
    args = parser().parse_args(["trajectories", "export", *argv])
    dest, episodes, count = export(client, args, progress=client.said.append)
    return client, dest, episodes, count


@pytest.mark.timeout(30)
def test_a_parquet_export_round_trips_with_pyarrow(tmp_path: Path) -> None:
    dest = tmp_path / "tree.parquet"
    client, written, episodes, count = _export(
        "-o", str(dest), "--label", "task=t", "--until", "1970-01-01T00:02:30Z"
    )
    assert client.asked[0]["labels"] == {"task": "t"}
    assert set(client.asked[0]["states"]) == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert (written, episodes, count) == (dest, 1, 5)
    table = pq.read_table(dest)
    assert table.schema == SCHEMAS["tree"]
    back = table.to_pylist()
    expected = rows("tree", "ep", _tree(), reward=0.75, labels={"task": "t"}, group_id="g", group_index=1)
    for row in expected:
        row["labels"] = list(row["labels"].items())
        row["spans"] = [list(s) for s in row["spans"]]
    assert back == expected
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.timeout(30)
def test_jsonl_exports_of_calls_and_atif(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    _export("-o", str(calls), "--records", "calls", "--since", "150", "--keep-masked")
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [r["episode_id"] for r in lines] == ["late"] * 9 and not any(r["masked"] for r in lines)
    assert lines[7]["abandoned"] and lines[7]["parent_id"] == 3
    docs = tmp_path / "atif.jsonl"
    _export("-o", str(docs), "--records", "atif")
    for line in docs.read_text().splitlines():
        atif.Trajectory.model_validate(json.loads(line)["atif"])


@pytest.mark.timeout(10)
def test_a_dataset_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    dest = tmp_path / "x.parquet"

    def failing() -> Iterator[list[dict[str, Any]]]:
        yield rows("calls", "ep", _tree())
        raise RuntimeError("the orchestrator went away")

    with pytest.raises(RuntimeError):
        write("calls", "parquet", dest, failing())
    assert list(tmp_path.iterdir()) == []
    assert write("calls", "parquet", dest, iter([])) == 0 and pq.read_table(dest).num_rows == 0


@pytest.mark.timeout(30)
def test_a_group_export_takes_its_finished_members_in_index_order(tmp_path: Path) -> None:
    dest = tmp_path / "g.jsonl"
    client, _, episodes, count = _export("-o", str(dest), "--records", "calls", "--group", "g")
    lines = [json.loads(line) for line in dest.read_text().splitlines()]
    assert episodes == 2 and count == 18
    assert [(r["episode_id"], r["group_id"], r["group_index"]) for r in lines[::9]] == [
        ("late", "g", 0),
        ("ep", "g", 1),
    ]
    assert client.said[0] == "group g: 1 of 3 members not finished yet"
    # With the other flags, the members that also match them.
    _, _, episodes, _ = _export("-o", str(dest), "--group", "g", "--until", "150")
    assert episodes == 1
    with pytest.raises(NotFound):
        _export("-o", str(dest), "--group", "nope")


@pytest.mark.timeout(10)
def test_the_export_flags_parse_times() -> None:
    args = parser().parse_args(
        ["trajectories", "export", "-o", "x.parquet", "--since", "2026-12-07T12:00:00Z"]
    )
    assert args.since == 1_796_644_800.0 and args.max_paths == 5 and args.records == "tree"
    with pytest.raises(SystemExit):
        parser().parse_args(["trajectories", "export", "-o", "x", "--since", "yesterday"])
    with pytest.raises(InvalidArgument, match="max-paths"):
        _export("-o", "x.parquet", "--max-paths", "0")


class _ForkedClient(_Client):
    """Members 0 and 1 of group g forked from one snapshot of ep-p: each trajectory starts with
    ep-p's turn 1, shared, and goes on with turns of its own."""

    def episodes(self, states: Sequence[str] = (), labels: dict[str, str] | None = None) -> list[Any]:
        return [
            SimpleNamespace(id=e, finished_at=at, forked_from="ep-p-s1", fork_parent="ep-p")
            for e, at in (("ep", 100.0), ("late", 200.0))
        ]

    def trajectory(self, episode_id: str, include_branches: bool = False) -> TrajectoryInfo:
        shared = _turn(1, [10, 11], shared=True, episode_id="ep-p")
        own = {"late": [_turn(2, [12], shared)], "ep": [_turn(3, [20, 21], shared)]}[episode_id]
        return _trajectory_info([shared, *own], "g", _MEMBERS[episode_id])


@pytest.mark.timeout(30)
def test_a_group_forked_from_one_snapshot_exports_as_one_set_of_trees(tmp_path: Path) -> None:
    """Its members' shared prefix is one prefix of one tree, trained once; each stream is the row
    of the member whose turn ends it, with that member's index."""
    dest = tmp_path / "g.jsonl"
    args = parser().parse_args(["trajectories", "export", "-o", str(dest), "--group", "g"])
    _, episodes, count = export(_ForkedClient(), args, progress=lambda _: None)
    lines = [json.loads(line) for line in dest.read_text().splitlines()]
    assert (episodes, count) == (2, 2)
    assert [(r["episode_id"], r["group_index"], r["turn_ids"]) for r in lines] == [
        ("late", 0, [1, 2]),
        ("ep", 1, [1, 3]),
    ]
    (start, end), _ = lines[0]["spans"]
    assert [r["loss_mask"][start:end] for r in lines] == [[1, 1], [0, 0]], "the shared turn trained once"
    assert [r["weights"][start:end] for r in lines] == [[1.0, 1.0]] * 2
    # Calls are each member's own, as before.
    args = parser().parse_args(
        ["trajectories", "export", "-o", str(dest), "--group", "g", "--records", "calls"]
    )
    assert export(_ForkedClient(), args, progress=lambda _: None)[2] == 4
