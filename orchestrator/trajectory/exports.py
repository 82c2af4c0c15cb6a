"""Exports a trainer takes as they are, and what they share: the fields an export reads of a turn
(`ExportTurn`), what it keeps and masks (`ExportSettings`), and the per-call records for trie
packing. The other exports are tree samples (`trees`) and ATIF v1.8 trajectories
(`interchange`); `dataset` writes them all.

Each is a pure function of the episode's turns: the ledger's `Turn`s, or the `TurnInfo`s a
client reads from `GetTrajectory` (both have the fields `ExportTurn` names).

**Masked turns.** An abandoned turn (the restored sandbox never had it) and a turn whose
delivery is uncertain are flagged and, by default (`ExportSettings`), masked: in no tree
sample, `masked` in the per-call records, and left out of the ATIF trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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


DEFAULTS = ExportSettings()


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


def parent_of(turn: ExportTurn) -> int | None:
    """The turn its prompt continues; None for a root."""
    return turn.parent_id or None  # the API sends 0 for a root


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


def call_records(turns: Sequence[ExportTurn], settings: ExportSettings = DEFAULTS) -> list[CallRecord]:
    """Every turn of the episode as a call record, in the order recorded (a parent first)."""
    return [_record(t, settings) for t in sorted(turns, key=lambda t: t.id)]


def _record(t: ExportTurn, settings: ExportSettings) -> CallRecord:
    return CallRecord(
        turn_id=t.id, parent_id=parent_of(t), edge=t.edge, edge_parent=t.edge_parent or None, branch=t.branch, run=t.run,
        prompt_token_ids=list(t.prompt_token_ids), completion_token_ids=list(t.token_ids),
        logprobs=list(t.logprobs), policy_version=t.policy_version, finish_reason=t.finish_reason,
        mode=t.mode, prefix_exact=t.prefix_exact, logprobs_exact=t.logprobs_exact,
        created_at=t.created_at, abandoned=t.abandoned, delivery_uncertain=delivery_uncertain(t),
        masked=masked(t, settings),
    )  # fmt: skip
