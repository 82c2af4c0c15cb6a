"""The gateway's counters, served in Prometheus's text format on `metrics_listen`: turns sampled
per mode, prompts that break the tokens before them, replays, turns whose log-probs are not of the
distribution their tokens were drawn from, turns recorded with no policy version, and group
members' turns held back past their group's `max_staleness`."""

from __future__ import annotations

import threading
from collections import Counter

from orchestrator.trajectory.turns import Turn

_HELP = {
    "turns": "Model turns sampled and recorded, by mode (tokens: prompts built as token ids; text: rendered upstream).",
    "prompt_breaks": "Turns whose prompt does not begin with the tokens sampled before it (drift), by mode.",
    "prompts_unchecked": "Turns whose prompt could not be checked against the tokens before it (no prompt ids).",
    "logprobs_inexact": "Turns whose log-probs are not of the distribution the tokens were drawn from.",
    "replays": "Requests answered from the ledger with a recorded turn.",
    "policy_version_unknown": "Turns recorded with no policy version: the model server named none and none was published.",
    "stale_held": "Turns of a GRPO group's member held back unsampled: they would exceed the group's max_staleness.",
    "upstream_failures": "Requests the model server failed (unreachable, timed out, a 5xx or an unreadable answer).",
}


class Metrics:
    """Counters; safe to bump from any thread."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        self._lock = threading.Lock()

    def count(self, name: str, **labels: str) -> None:
        with self._lock:
            self._counts[(name, tuple(sorted(labels.items())))] += 1

    def turn(self, turn: Turn) -> None:
        """Count a freshly recorded turn."""
        self.count("turns", mode=turn.mode)
        if turn.prefix_exact is False:
            self.count("prompt_breaks", mode=turn.mode)
        elif turn.prefix_exact is None:
            self.count("prompts_unchecked", mode=turn.mode)
        if not turn.logprobs_exact:
            self.count("logprobs_inexact", mode=turn.mode)
        if not turn.policy_version:
            self.count("policy_version_unknown")

    def value(self, name: str, **labels: str) -> int:
        with self._lock:
            return self._counts[(name, tuple(sorted(labels.items())))]

    def text(self) -> str:
        """The exposition: every counter, with its HELP and TYPE lines."""
        with self._lock:
            counts = dict(self._counts)
        lines = []
        for name, help_text in _HELP.items():
            metric = f"stasis_gateway_{name}_total"
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
            for (counted, labels), value in sorted(counts.items()):
                if counted == name:
                    tags = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines.append(f"{metric}{{{tags}}} {value}" if tags else f"{metric} {value}")
        return "\n".join(lines) + "\n"
