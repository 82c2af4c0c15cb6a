"""One harness request on its way to becoming a recorded turn: what the gateway learns of it
between authentication and the ledger."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from orchestrator.domain import Episode
from orchestrator.gateway.prompts import Prompt
from orchestrator.gateway.protocols import Protocol, Request
from orchestrator.trajectory.turns import Sampling
from orchestrator.trajectory.turns import Turn as RecordedTurn


@dataclass(frozen=True)
class Turn:
    """One harness request on its way to becoming a recorded turn."""

    episode: Episode
    resumed_at: float
    protocol: Protocol
    request: Request
    raw: bytes
    parent: RecordedTurn | None = None
    """The recorded turn it continues, found before it is sampled."""
    body: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What is sent upstream."""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    prompt: Prompt | None = None
    """Token mode: the prompt ids and how they extend the parent's tokens."""
    logprobs_mode: str = ""
    """What the upstream's log-probs are of (`probe`)."""
    published: int = 0
    """The policy version published when its sampling began (0: none), which it records if the
    upstream names none."""

    @property
    def published_version(self) -> str:
        """The version it records when the upstream names none: the one published when its
        sampling began; "" if none was."""
        return str(self.published) if self.published else ""
