"""Rewards come from outside the sandbox: after the harness exits, a verifier sandbox on the same
node, rooted in a trusted image, reads the episode's final tree at /episode (read-only, noexec)
beside files the episode never saw, and prints the reward as the last line of its output."""

from __future__ import annotations

import json
import math

from orchestrator.control.node_agent import NodeAgents
from orchestrator.control.operations import default_finish
from orchestrator.domain import Episode, EpisodeState, PermanentError, StasisError, TemporaryError
from orchestrator.task import agent_logs, read_reward
from orchestrator.trajectory import Ledger, Verification, atif


def parse_reward(log: bytes) -> float:
    """The verifier's last non-empty output line, as a finite float."""
    lines = [line.strip() for line in log.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ValueError("the verifier printed nothing; its last line must be the reward")
    try:
        reward = float(lines[-1])
    except ValueError:
        raise ValueError(f"the verifier's last line {lines[-1][:120]!r} is not a number") from None
    if not math.isfinite(reward):
        raise ValueError(f"the verifier's last line {lines[-1][:120]!r} is not a finite number")
    return reward


class Verifier:
    """The control loop's finish step for episodes with a reward section."""

    def __init__(self, agents: NodeAgents, ledger: Ledger) -> None:
        self.agents = agents
        self.ledger = ledger

    def __call__(self, e: Episode, exit_code: int | None) -> tuple[EpisodeState, str, float | None]:
        if e.spec.reward is None:
            return default_finish(e, exit_code)
        harness = f"harness exited with code {exit_code}"
        spec = e.spec.reward
        files = {**spec.files, **self._trajectory(e)} if spec.output == "harbor" else spec.files
        try:
            outcome = self.agents.get(e.node).run_verifier(
                e.sandbox_id, spec.command, files, spec.image, spec.timeout_s
            )
        except TemporaryError:
            raise  # the sandbox is still there; the control loop tries again
        except StasisError as exc:
            raise PermanentError(f"{harness}; the verifier could not run: {exc}") from exc
        tail = outcome.log[-4096:]
        reward: float | None = None
        metrics: dict[str, float] = {}
        if outcome.timed_out:
            problem = f"the verifier ran past reward.timeout_s={spec.timeout_s:g}"
        elif outcome.exit_code != 0 and spec.output == "line":
            problem = f"the verifier crashed with exit code {outcome.exit_code}"
        else:
            try:
                if spec.output == "harbor":  # the grader's line says how the tests exited
                    reward, metrics = read_reward(outcome.log)
                else:
                    reward = parse_reward(outcome.log)
                problem = ""
            except ValueError as exc:
                problem = str(exc)
        self.ledger.verifications.record(
            e.id,
            Verification(reward, outcome.exit_code, outcome.timed_out, tail, outcome.duration_ms, metrics),
        )
        if reward is None:
            last = tail.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return EpisodeState.FAILED, f"{harness}; {problem}: {last[0][:200]}", None
        return EpisodeState.SUCCEEDED, f"{harness}; reward {reward:g}", reward

    def _trajectory(self, e: Episode) -> dict[str, bytes]:
        """A Harbor task's tests read the agent's trajectory as ATIF, at /logs/agent."""
        turns = self.ledger.turns(e.id)
        documents = atif(e.id, turns, labels=e.spec.labels) if turns else []
        return agent_logs([json.dumps(d, separators=(",", ":")).encode() for d in documents])
