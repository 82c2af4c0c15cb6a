"""The reference model as the end-to-end tests run it: slowed to stream a token at a time, so a
sandbox can be frozen while a generation streams."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.cli.local import LocalStack
from orchestrator.reference_model import TOKENIZER_DIR, ReferenceModelServer, ReferenceModelSettings

TOKENS = {"renderer": "qwen3", "tokenizer": str(TOKENIZER_DIR)}
"""The gateway's model settings for token-in-token-out over the reference model (`stasis up`'s
default): its Qwen3 template, its tokenizer directory."""


def slow_model(delay_s: float = 0.08, **settings: object) -> ReferenceModelServer:
    """The reference model streaming a token every `delay_s`; its `streams_begun` tells when a
    generation is under way."""
    return ReferenceModelServer(
        ReferenceModelSettings(seed=5, stream_token_delay_s=delay_s, **settings)
    ).start()  # type: ignore[arg-type]


def under_way(
    stack: LocalStack, model: ReferenceModelServer, episode_id: str, turns: int
) -> Callable[[], bool]:
    """Whether, with at least `turns` of the episode recorded, one more of its generations is
    streaming (a predicate for `wait_until`)."""
    assert stack.orchestrator is not None
    ledger = stack.orchestrator.ledger

    def check() -> bool:
        recorded = len(ledger.turns(episode_id))
        return recorded >= turns and model.streams_begun > recorded

    return check
