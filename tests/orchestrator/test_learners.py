"""The example learners (examples/trainer/) against a local stack and the reference model: two
policy versions each, a member preempted mid-episode and resumed on the other node, every ratio
exactly 1 and every drift exactly 0 on the first update under each token's own version."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from examples.trainer import flash_reinforce, grpo
from examples.trainer.learner import ReferencePolicy
from orchestrator import StasisClient
from orchestrator.cli.local import LocalStack
from orchestrator.client import EpisodeInfo
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from tests.orchestrator.conftest import wait_until
from tests.orchestrator.models import TOKENS

HARNESS = r"""
import json, os, time, urllib.request
def ask(messages):
    body = json.dumps({"model": "reference", "messages": messages, "max_tokens": 10}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    for attempt in range(20):
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["choices"][0]["message"]["content"] or ""
        except Exception as exc:  # a connection a restore closed: ask again
            print("retry after", type(exc).__name__, flush=True)
            time.sleep(0.2)
    raise SystemExit("no answer")
messages = [{"role": "user", "content": os.environ["PROMPT"]}]
for turn in range(3):
    text = ask(messages)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    print("answer", len(text), flush=True)
    time.sleep(1.0)
"""
# The reward: the length of the answers, so that rollouts differ and advantages are not all 0.
GRADER = [
    "python3",
    "-c",
    "print(sum(int(line.split()[1]) for line in open('/episode/.stasis/harness.log') if line.startswith('answer')) / 100)",
]


def spec(prompt: str) -> dict[str, Any]:
    return {
        "image": "base",
        "command": ["python3", "-c", HARNESS],
        "env": {"PROMPT": prompt},
        "resources": {"cpus": 0.5, "memory_mb": 256},
        "reward": {"command": GRADER},
    }


@pytest.fixture
def model() -> Iterator[ReferenceModelServer]:
    server = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    yield server
    server.stop()


def preempt_one(stack: LocalStack, c: StasisClient) -> Callable[[list[EpisodeInfo]], None]:
    """Freeze the first episode once it has a turn, and resume it on the other node."""
    assert stack.orchestrator is not None
    ledger = stack.orchestrator.ledger

    def preempt(episodes: list[EpisodeInfo]) -> None:
        episode = episodes[0]
        node = c.wait(episode.id, ["RUNNING"], timeout_s=60).node
        wait_until(lambda: ledger.turns(episode.id), 60, "a turn")
        c.preempt(episode.id, reason="learner e2e")
        c.wait(episode.id, ["PREEMPTED"], timeout_s=60)
        c.resume(episode.id, node="node-2" if node == "node-1" else "node-1")

    return preempt


def assert_preempted_and_resumed(c: StasisClient, episode_ids: list[str]) -> None:
    assert any(c.get(e).runs >= 2 for e in episode_ids), "a member ran again after its preemption"


@pytest.mark.timeout(180)
def test_grpo_over_two_versions_is_exactly_on_policy_across_a_preemption(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    stack = make_stack(nodes=2, slots=2, upstream=model.url, model=TOKENS)
    with stack.client() as c:
        updates = grpo.train(
            c, ReferencePolicy(model.model), spec("fix the bug"), versions=[1, 2], size=4,
            on_submitted=preempt_one(stack, c),
        )  # fmt: skip
        assert [u.version for u in updates] == [1, 2]
        for u in updates:
            assert u.group.complete and len(u.terms) == 4
            assert all(r == 1.0 for t in u.terms for r in t.ratios)
            assert all(t.drift == 0.0 for t in u.terms)
            assert abs(sum(u.advantages)) < 1e-9
            assert_preempted_and_resumed(c, [m.episode_id for m in u.group.members])
            for m in u.group.members:
                versions = {
                    v
                    for sample in c.trajectory(m.episode_id).samples
                    for v, k in zip(sample.policy_versions, sample.loss_mask, strict=True)
                    if k
                }
                assert versions == {str(u.version)}, "each token records the version it was sampled under"


@pytest.mark.timeout(180)
def test_flash_reinforce_over_two_versions_is_exactly_on_policy_across_a_preemption(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    stack = make_stack(nodes=2, slots=2, upstream=model.url, model=TOKENS)
    prompts = ["fix the bug", "write a test", "rename the module", "read the log"]
    with stack.client() as c:
        updates = flash_reinforce.train(
            c, ReferencePolicy(model.model), [spec(p) for p in prompts], versions=[1, 2],
            on_submitted=preempt_one(stack, c),
        )  # fmt: skip
        assert [u.version for u in updates] == [1, 2]
        for u in updates:
            assert len(u.terms) == 4 and all(u.trusted)
            assert all(r == 1.0 for t in u.terms for r in t.ratios)
            assert all(t.drift == 0.0 for t in u.terms)
            assert abs(sum(u.advantages)) < 1e-9
            assert_preempted_and_resumed(c, [t.episode_id for t in u.terms])
