"""Training samples: an episode's recorded turns laid out as token sequences a trainer takes as
they are.

A sample is one turn's prompt plus its sampled tokens. Its loss mask is 1 on the tokens sampled
by each turn of the chain it closes, and its log-probs are those the model reported for them. A
turn continues the sample of the turn before it on its branch when its prompt begins with that
sample's tokens exactly (`prefix_exact`), and it was sampled with the same temperature, top-p
and top-k. Otherwise, at a break in the prompt or a change of sampling, a new sample begins, with
the whole prompt as context: nothing is appended that the model did not see. So a linear
conversation is one sample, the last turn's prompt plus its answer.

Every sampled token is trained in one sample only. A branch's first turn (a parallel call, a
subagent, a side call, a compaction) starts a sample of its own, and the tokens it shares with its
parent are context there; a restore divergence continues its parent's sample on the branch it
takes over. Abandoned turns (the sandbox never had them) and turns whose prompt ids
are unknown are in no sample; the turns say why.

Each sampled token carries the policy version it was sampled under and its staleness: the
version published when the samples are made (`published`) minus the token's own, where both are
integers (`policy.staleness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.trajectory.policy import staleness
from orchestrator.trajectory.turns import Sampling, Turn


@dataclass
class Sample:
    """One token sequence for a trainer."""

    token_ids: list[int]
    loss_mask: list[int]
    """1 for tokens the policy sampled (trainable), 0 for context."""
    logprobs: list[float]
    """The behaviour log-prob of each sampled token; 0 for context."""
    policy_versions: list[str]
    """The policy version that sampled each token; "" for context."""
    turn_ids: list[int]
    """The turns whose sampled tokens the sample holds, in order."""
    branch: int
    sampling: Sampling
    logprobs_exact: bool
    """Every sampled token's log-prob is of the distribution it was drawn from (the upstream
    reports processed log-probs, or the turns sampled at temperature 1 without top-p or top-k)."""
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Where each turn's sampled tokens lie: [start, end) per turn_ids entry."""
    published_version: int = 0
    """The policy version published when the sample was made; 0 if none was."""
    staleness: list[int] = field(default_factory=list)
    """Per token: `published_version` minus the version that sampled it; 0 for context and
    where `staleness_known` is false."""
    staleness_known: list[bool] = field(default_factory=list)
    """Per token: its staleness is a number (a sampled token whose version is an integer, with
    a version published); false for context."""


def samples(turns: Sequence[Turn], published: int = 0) -> list[Sample]:
    """The training samples of an episode's turns (see the module docstring), their staleness
    measured against the `published` policy version (0: none published)."""
    chains: list[list[Turn]] = []
    open_chain: dict[int, list[Turn]] = {}
    for turn in sorted(turns, key=lambda t: t.id):
        if turn.abandoned or not turn.prompt_token_ids:
            continue
        chain = open_chain.get(turn.branch)
        if chain is not None and _continues(chain[-1], turn):
            chain.append(turn)
            continue
        chain = [turn]
        chains.append(chain)
        open_chain[turn.branch] = chain
    return [_sample(chain, published) for chain in chains]


def _continues(last: Turn, turn: Turn) -> bool:
    if turn.parent_id != last.id or turn.prefix_exact is not True:
        return False
    if turn.sampling.distribution != last.sampling.distribution:
        return False
    seen = len(last.prompt_token_ids) + len(last.token_ids)
    return (
        turn.prompt_token_ids[: len(last.prompt_token_ids)] == last.prompt_token_ids
        and turn.prompt_token_ids[len(last.prompt_token_ids) : seen] == last.token_ids
    )


def _sample(chain: list[Turn], published: int) -> Sample:
    last = chain[-1]
    tokens = [*last.prompt_token_ids, *last.token_ids]
    mask, logprobs, versions = [0] * len(tokens), [0.0] * len(tokens), [""] * len(tokens)
    stale, known = [0] * len(tokens), [False] * len(tokens)
    spans = []
    for turn in chain:
        start = len(turn.prompt_token_ids)
        end = start + len(turn.token_ids)
        mask[start:end] = [1] * len(turn.token_ids)
        logprobs[start:end] = turn.logprobs
        versions[start:end] = [turn.policy_version] * len(turn.token_ids)
        lag = staleness(published, turn.policy_version)
        if lag is not None:
            stale[start:end] = [lag] * len(turn.token_ids)
            known[start:end] = [True] * len(turn.token_ids)
        spans.append((start, end))
    return Sample(
        token_ids=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        policy_versions=versions,
        turn_ids=[t.id for t in chain],
        branch=last.branch,
        sampling=last.sampling,
        logprobs_exact=all(t.logprobs_exact for t in chain),
        spans=spans,
        published_version=published,
        staleness=stale,
        staleness_known=known,
    )
