"""The on-policy check a trainer relies on, as the tests hold recorded episodes to it: every
loss-masked token of every sample has a recorded log-prob exactly equal (`==` on floats) to the
reference model's teacher-forced pass over that sample's ids, under that token's policy version,
so the importance ratio is exactly 1; and every turn's prompt begins with its parent's prompt ids
plus sampled ids."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.reference_model import ReferenceModel
from orchestrator.trajectory import Sample, Turn, samples


def assert_on_policy(turns: Sequence[Turn], model: ReferenceModel) -> list[Sample]:
    """Hold an episode's turns to the invariant; returns its samples."""
    live = [t for t in turns if not t.abandoned]
    assert live, "no turns"
    by_id = {t.id: t for t in turns}
    for t in live:
        assert t.mode == "tokens", (t.id, t.mode)
        assert t.prefix_exact is True, (t.id, t.lineage)
        if t.parent_id is not None:
            parent = by_id[t.parent_id]
            before = parent.prompt_token_ids + parent.token_ids
            assert t.prompt_token_ids[: len(before)] == before, t.id
    got = samples(turns)
    assert sorted(i for s in got for i in s.turn_ids) == sorted(t.id for t in live), "each turn in one sample"
    for sample in got:
        assert sample.logprobs_exact
        versions = {v for v, m in zip(sample.policy_versions, sample.loss_mask, strict=True) if m}
        for version in versions:
            forced = model.logprobs(
                sample.token_ids,
                version,
                temperature=sample.sampling.temperature,
                top_p=sample.sampling.top_p,
            )
            for i, masked in enumerate(sample.loss_mask):
                if masked and sample.policy_versions[i] == version:
                    assert sample.logprobs[i] == forced[i], (
                        sample.turn_ids,
                        i,
                        sample.logprobs[i],
                        forced[i],
                    )
    return got


def assert_linear(turns: Sequence[Turn], got: Sequence[Sample]) -> None:
    """A linear episode is exactly one sample: its last turn's prompt plus its answer."""
    live = [t for t in turns if not t.abandoned]
    (sample,) = got
    last = max(live, key=lambda t: t.id)
    assert sample.token_ids == last.prompt_token_ids + last.token_ids
    assert sum(sample.loss_mask) == sum(len(t.token_ids) for t in live)
