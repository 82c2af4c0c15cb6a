"""Training samples from recorded turns: a linear conversation is one sample; a prompt that
breaks the tokens before it, or a change of sampling, starts a new one with the whole prompt as
context; each sampled token is trained in one sample only; abandoned turns and turns without
prompt ids are in none."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.trajectory import Lineage, Sampling, Turn, samples
from orchestrator.trajectory.turns import ROOT, common_prefix, extension


def _turn(
    turn_id: int,
    prompt: list[int],
    sampled: list[int],
    parent: Turn | None = None,
    branch: int = 0,
    **fields: Any,
) -> Turn:
    lineage = fields.pop("lineage", None) or extension(parent, prompt)
    base: dict[str, Any] = dict(
        id=turn_id, episode_id="ep", parent_id=lineage.parent_id, branch=branch, run=1, kind="chat",
        request_raw=b"", response=b"", protocol="chat", delivered=b"", delivered_run=1, delivered_at=None,
        token_ids=sampled, logprobs=[-0.5 - t / 100 for t in sampled], prompt_token_ids=prompt,
        policy_version=f"v{turn_id}", abandoned=False, replays=0, created_at=0.0, lineage=lineage,
        logprobs_mode="processed",
    )  # fmt: skip
    base.update(fields)
    return Turn(**base)


@pytest.mark.timeout(10)
def test_a_linear_conversation_is_one_sample_of_its_last_prompt_and_answer() -> None:
    t1 = _turn(1, [1, 2, 3], [10, 11])
    t2 = _turn(2, [1, 2, 3, 10, 11, 4, 5], [12], parent=t1)
    t3 = _turn(3, [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14, 15], parent=t2)
    assert t2.prefix_exact and t3.prefix_exact and t3.lineage.common_prefix == 8
    (sample,) = samples([t3, t1, t2])
    assert sample.token_ids == t3.prompt_token_ids + t3.token_ids
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == (
        t1.logprobs + t2.logprobs + t3.logprobs
    )
    assert sample.policy_versions[3:5] == ["v1", "v1"] and sample.policy_versions[:3] == ["", "", ""]
    assert sample.turn_ids == [1, 2, 3] and sample.spans == [(3, 5), (7, 8), (9, 12)]
    assert sample.logprobs_exact


@pytest.mark.timeout(10)
def test_a_break_starts_a_new_sample_and_appends_no_prompt_whole() -> None:
    t1 = _turn(1, [1, 2, 3], [10, 11])
    # The model server re-rendered: the prompt leaves the sampled tokens after [1, 2, 3, 10].
    t2 = _turn(2, [1, 2, 3, 10, 99, 4], [12], parent=t1)
    assert t2.prefix_exact is False and t2.lineage.common_prefix == 4
    assert "4 of 5" in t2.lineage.break_reason
    t3 = _turn(3, [1, 2, 3, 10, 99, 4, 12, 5], [13], parent=t2)
    first, second = samples([t1, t2, t3])
    assert first.token_ids == [1, 2, 3, 10, 11] and first.turn_ids == [1]
    assert second.token_ids == [1, 2, 3, 10, 99, 4, 12, 5, 13] and second.turn_ids == [2, 3]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1, 0, 1], "the first turn's tokens are context here"
    assert max(len(s.token_ids) for s in samples([t1, t2, t3])) == len(t3.prompt_token_ids) + 1


@pytest.mark.timeout(10)
def test_a_change_of_sampling_starts_a_new_sample() -> None:
    t1 = _turn(1, [1, 2], [10], sampling=Sampling(temperature=0.7))
    t2 = _turn(2, [1, 2, 10, 3], [11], parent=t1, sampling=Sampling(temperature=0.7, max_tokens=9))
    t3 = _turn(3, [1, 2, 10, 3, 11, 4], [12], parent=t2, sampling=Sampling(temperature=1.0))
    a, b = samples([t1, t2, t3])
    assert a.turn_ids == [1, 2] and a.sampling.temperature == 0.7
    assert b.turn_ids == [3] and b.sampling.temperature == 1.0 and sum(b.loss_mask) == 1


@pytest.mark.timeout(10)
def test_branches_abandoned_turns_and_unchecked_prompts() -> None:
    t1 = _turn(1, [1, 2], [10, 11])
    main = _turn(2, [1, 2, 10, 11, 3], [12], parent=t1)
    parallel = _turn(3, [1, 2, 10, 11, 4], [13], parent=t1, branch=1)
    gone = _turn(4, [1, 2, 10, 11, 5], [14], parent=t1, branch=2, abandoned=True)
    unknown = _turn(5, [], [15], parent=main, lineage=Lineage(2, None, 0, "no ids"))
    got = samples([t1, main, parallel, gone, unknown])
    assert [s.turn_ids for s in got] == [[1, 2], [3]]
    assert got[1].token_ids == [1, 2, 10, 11, 4, 13] and got[1].loss_mask == [0, 0, 0, 0, 0, 1]
    assert sorted(t for s in got for t in s.turn_ids) == [1, 2, 3]


@pytest.mark.timeout(10)
def test_raw_logprobs_are_exact_only_without_temperature_or_nucleus() -> None:
    plain = _turn(1, [1], [2], logprobs_mode="raw")
    hot = _turn(2, [1, 2, 3], [4], parent=plain, logprobs_mode="raw", sampling=Sampling(temperature=0.6))
    assert plain.logprobs_exact and not hot.logprobs_exact
    assert [s.logprobs_exact for s in samples([plain, hot])] == [True, False]
    assert _turn(3, [1], [2], logprobs_mode="", sampling=Sampling(top_p=0.9)).logprobs_exact is False


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ([], [], 0),
        ([1], [], 0),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3], [1, 9, 3], 1),
        (list(range(1000)), [*range(700), 5], 700),
    ],
)
def test_common_prefix(a: list[int], b: list[int], n: int) -> None:
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_a_root_extends_nothing() -> None:
    assert extension(None, [1, 2]) == ROOT and ROOT.prefix_exact is True
