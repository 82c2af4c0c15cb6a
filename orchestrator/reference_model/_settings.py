"""Settings of the reference model server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceModelSettings:
    """How the reference model samples and where it listens."""

    host: str = "127.0.0.1"
    """Address to bind; the default keeps the server off every network but loopback."""
    port: int = 0
    """TCP port; 0 picks a free one, which tests and `stasis up` read back from `url`."""
    seed: int = 0
    """Seeds the logit tables (with the policy version) and the RNG used for requests without a seed."""
    policy_version: str = "policy-v1"
    """Reported as system_fingerprint and x-policy-version; part of the weights, so a new version samples differently."""
    model_name: str = "reference"
    """The id listed by GET /v1/models (requests may name any model; the response echoes it)."""
    mean_tool_turns: float = 5.0
    """Tool results after which answering becomes more likely than calling again (so episodes end after ~3-8 turns)."""
    mean_answer_tokens: float = 24.0
    """Answer length, in tokens, at which ending becomes more likely than continuing; outside an
    assistant turn, the mean length of free text."""
    think_probability: float = 0.25
    """Chance (at temperature 1) that a turn opens with reasoning (`<think>`), so that every
    harness protocol carries some back and forth; 0 never reasons."""
    mean_think_tokens: float = 16.0
    """Reasoning length, in tokens, at which closing it becomes more likely than going on."""
    logprobs_mode: str = "processed"
    """Which log-probs responses report, as vLLM's `--logprobs-mode`: `processed` (of the
    distribution each token is drawn from: after temperature and top-p) or `raw` (of the model's
    distribution at temperature 1, before them), which is not the sampling distribution when a
    request sets either."""
    default_max_tokens: int = 1024
    """Chat max_tokens when the request sets none; far above any grammar-bounded tool call."""
    stream_token_delay_s: float = 0.0
    """Pause between streamed chunks, standing in for a model's time per token (0 = as fast as possible)."""
    access_log: bool = False
    """Log one line per HTTP request to stderr."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.mean_tool_turns < 0:
            raise ValueError(f"mean_tool_turns must be >= 0, got {self.mean_tool_turns}")
        if not 0 <= self.think_probability < 1:
            raise ValueError(f"think_probability must be in [0, 1), got {self.think_probability}")
        if self.mean_think_tokens < 1:
            raise ValueError(f"mean_think_tokens must be >= 1, got {self.mean_think_tokens}")
        if self.logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be processed or raw, got {self.logprobs_mode!r}")
        if self.mean_answer_tokens < 1:
            raise ValueError(f"mean_answer_tokens must be >= 1, got {self.mean_answer_tokens}")
        if self.stream_token_delay_s < 0:
            raise ValueError(f"stream_token_delay_s must be >= 0, got {self.stream_token_delay_s}")
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
