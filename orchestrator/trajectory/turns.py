"""A recorded turn as the rest of Stasis reads it: its tokens, the sampling they were drawn with,
how its prompt stands to its parent's tokens (`Lineage`, worked out by `extension`), and the
branches of the tree it sits in. The ledger makes them; the gateway, samples and exports read
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a turn's tokens were drawn with, as the gateway asked for them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k cut."""
    max_tokens: int = 0
    """The turn's limit (0: the upstream's); not part of what decides a token's distribution."""

    @property
    def distribution(self) -> tuple[float, float, int]:
        """What decides the distribution a token is drawn from."""
        return self.temperature, self.top_p, max(self.top_k, 0)

    @property
    def plain(self) -> bool:
        """Temperature 1, no top-p, no top-k: raw and processed log-probs are the same."""
        return self.distribution == (1.0, 1.0, 0)


PLAIN = Sampling()
"""Temperature 1, no top-p, no top-k: what a turn that names no sampling was drawn with."""


@dataclass(frozen=True)
class Lineage:
    """How a turn's prompt stands to its parent's tokens."""

    parent_id: int | None
    prefix_exact: bool | None
    """The prompt begins with the parent's prompt ids plus its sampled ids; True for a root (no
    parent), None when the upstream gave no prompt ids to check."""
    common_prefix: int = 0
    """How many leading tokens the prompt shares with the parent's prompt plus sampled ids."""
    break_reason: str = ""
    """Why the prompt does not extend the parent's tokens, when it does not."""


ROOT = Lineage(None, True)


@dataclass(frozen=True)
class Turn:
    id: int
    episode_id: str
    parent_id: int | None
    branch: int
    run: int
    kind: str
    request_raw: bytes
    """The harness's request body as it arrived."""
    response: bytes
    """The upstream's response as it arrived (its server-sent events, when streamed)."""
    protocol: str
    delivered: bytes
    """The exact bytes the harness gets in its own protocol; a replay sends them again."""
    delivered_run: int
    """The latest run of the sandbox a delivery of this turn reached its end in: the run that
    asked for it until then, a replay's run once the replay is out."""
    delivered_at: float | None
    """When the last part of the last delivery that reached its end was about to go out; None
    while none has."""
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int]
    policy_version: str
    abandoned: bool
    replays: int
    created_at: float
    after_len: int = 0
    """The length of the conversation once this turn's answer is appended: messages (chat) or
    characters (completion)."""
    mode: str = "text"
    """tokens: the gateway built the prompt as ids and parsed the sampled ids itself; text: the
    upstream rendered the messages and parsed its own answer."""
    lineage: Lineage = ROOT
    finish_reason: str = ""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    logprobs_mode: str = ""
    """What the upstream's log-probs were found to be of when this turn was sampled: processed
    (the sampling distribution), raw (before temperature and top-p), or "" (not known)."""
    tools_key: str = ""
    """Digest of the tools the prompt lists: a prompt can extend the parent's tokens only if equal."""
    upstream_ms: float = 0.0
    """How long the upstream took to answer (to its last event, when streamed)."""
    sending_run: int = 0
    """A delivery to this run was under way (its last part about to go out) and has not been
    seen to end either way; 0 when none is. Noted durably before that part leaves, so a turn the
    harness may have is never read as one it cannot have (`Ledger.sending`)."""
    sending_at: float | None = None
    """When that delivery's last part was about to go out."""
    edge: str = ""
    """How the turn hangs in the tree (`edges.Edge`); "" for a turn recorded before edges were."""
    edge_parent: int | None = None
    """The turn it hangs from: its parent, the turn whose tool call spawned a subagent, the
    compaction a conversation continues from; None for a root, a side call, an unlinked subagent."""
    shared: bool = False
    """Read in a fork child's trajectory: the turn is an ancestor's (`episode_id`), recorded
    before the snapshot the child was forked from, and shared with it, not copied (`forks`)."""

    @property
    def delivery_uncertain(self) -> bool:
        """A delivery was under way when the orchestrator stopped: the harness may have the turn."""
        return self.sending_run > 0

    @property
    def prefix_exact(self) -> bool | None:
        return self.lineage.prefix_exact

    @property
    def logprobs_exact(self) -> bool:
        """The recorded log-probs are of the distribution each token was drawn from."""
        return self.logprobs_mode == "processed" or self.sampling.plain


@dataclass
class Branch:
    id: int
    turns: list[Turn]
    abandoned: bool

    @property
    def edge(self) -> str:
        """What the branch is: its first turn's edge."""
        return self.turns[0].edge if self.turns else ""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items two sequences share (slices compare in C; a binary search over
    them keeps a long history's check cheap)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def extension(parent: Turn | None, prompt_ids: Sequence[int], reason: str = "") -> Lineage:
    """How a prompt stands to the tokens of the turn it continues: whether it begins with the
    parent's prompt plus its sampled ids, and if not, where it leaves them."""
    if parent is None:
        return ROOT
    before = [*parent.prompt_token_ids, *parent.token_ids]
    if not prompt_ids or not parent.prompt_token_ids:
        return Lineage(parent.id, None, 0, "the model server returned no prompt token ids to check")
    common = common_prefix(before, prompt_ids)
    if common == len(before):
        return Lineage(parent.id, True, common)
    why = reason or "the model server rendered the conversation anew as text"
    return Lineage(
        parent.id,
        False,
        common,
        f"{why}: the prompt leaves the tokens sampled so far at {common} of {len(before)}",
    )
