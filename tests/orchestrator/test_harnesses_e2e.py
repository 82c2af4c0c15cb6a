"""Unmodified black-box harnesses in real sandboxes: Claude Code over Anthropic Messages and Codex
over OpenAI Responses, both streaming, through the gateway to the reference model as token ids,
preempted in the middle of a generation and resumed on the other node; plus the official
anthropic SDK. Each episode is held to the on-policy invariant (`onpolicy.py`). Claude Code's
preemption mid-stream runs on a Harbor task, laid over its environment (test_tasks_e2e.py).

The binaries are the pinned npm releases `scripts/host-setup.sh` unpacked into the cache."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.local import LocalStack
from orchestrator.domain import EpisodeSpec
from orchestrator.reference_model import ReferenceModelServer
from sandbox_agent.images.cache import ImageCache
from tests.orchestrator.conftest import link_base_tree, link_tree, wait_until
from tests.orchestrator.models import TOKENS, slow_model, under_way
from tests.orchestrator.onpolicy import assert_linear, assert_on_policy

HARNESSES = Path("/var/cache/stasis/harnesses")
CLAUDE = HARNESSES / "claude-code-2.1.328" / "claude"
CODEX = HARNESSES / "codex-0.169.0" / "vendor" / "x86_64-unknown-linux-musl"
CODEX_FLAGS = "--skip-git-repo-check --dangerously-bypass-approvals-and-sandbox"
TASK = "Create notes.txt listing three facts about the sea, then check the file."


@pytest.fixture(scope="module")
def harness_images(tmp_path_factory: pytest.TempPathFactory, base_images: Path) -> Path:
    """An image cache with `harnesses`: the base image plus Claude Code, Codex and the anthropic
    SDK, imported once for the module. Each test's stack gets it as hard links (`seed_images`)."""
    for path in (CLAUDE, CODEX / "bin" / "codex"):
        if not path.exists():
            pytest.fail(f"{path} is missing; run scripts/host-setup.sh")
    root = tmp_path_factory.mktemp("harness-image") / "rootfs"
    link_base_tree(base_images, root)
    bin_dir = root / "usr" / "local" / "bin"
    shutil.copy2(CLAUDE, bin_dir / "claude")
    shutil.copytree(CODEX, root / "opt" / "codex", symlinks=True)
    (bin_dir / "codex").symlink_to("/opt/codex/bin/codex")
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    pip = ["python3", "-m", "pip", "install", "-q", "--target", str(site), "--python-version", "3.11"]
    subprocess.run([*pip, "--only-binary=:all:", "--no-compile", "anthropic"], check=True)
    images = root.parent / "images"
    link_tree(base_images, images)
    ImageCache(images).import_directory(root, name="harnesses")
    return images


@pytest.fixture
def model() -> Iterator[ReferenceModelServer]:
    server = slow_model()
    yield server
    server.stop()


def _turns(stack: LocalStack, episode_id: str) -> list[Any]:
    assert stack.orchestrator is not None
    return stack.orchestrator.ledger.turns(episode_id)


def preempted_mid_generation_and_finished(
    stack: LocalStack, model: ReferenceModelServer, spec: EpisodeSpec | dict[str, Any], protocol: str
) -> list[Any]:
    """Run the spec, freeze it while a generation is streaming after two recorded turns, resume
    it on the other node, and return its recorded turns once it exits 0, held to the on-policy
    invariant."""
    with stack.client() as c:
        episode = c.submit(spec)
        first = c.wait(episode.id, ["RUNNING"], timeout_s=120).node
        wait_until(under_way(stack, model, episode.id, 2), 180, "a third generation under way")
        c.preempt(episode.id)
        try:
            c.wait(episode.id, ["PREEMPTED"], timeout_s=120)
        except Exception:
            raise AssertionError([e.reason for e in c.events(episode.id)]) from None
        c.resume(episode.id, node="node-2" if first == "node-1" else "node-1")
        final = c.wait(episode.id, ["SUCCEEDED", "FAILED"], timeout_s=300)
        log = c.trajectory(episode.id)
        assert final.state == "SUCCEEDED" and final.exit_code == 0, (final.reason, log.verifier_log)
        assert final.runs == 2 and final.snapshots == 1
        turns = _turns(stack, episode.id)
        trajectory = c.trajectory(episode.id, include_branches=True)
    assert {t.protocol for t in turns} == {protocol}
    assert len(turns) >= 3, "several model turns"
    assert any(b'"tool_use"' in t.delivered or b'"function_call"' in t.delivered for t in turns), "tool use"
    main = trajectory.main
    assert len({t.id for t in main.turns}) == len(main.turns), "each main-branch turn once"
    # Main is the primary conversation: it begins at its root and holds no side call or subagent.
    assert main.edge == "root" and {t.edge for t in main.turns} <= {"root", "continuation", "divergence"}, [
        (t.id, t.edge, t.edge_parent) for t in turns
    ]
    for recorded in turns:
        assert len(recorded.token_ids) == len(recorded.logprobs) > 0
    # The last main-branch turn reached the restored run: generated there, or, when the generation
    # frozen mid-stream was the harness's last, replayed to it.
    shape = [(t.id, t.branch, t.run, t.delivered_run, t.replays) for t in turns]
    assert [t.delivered_run for t in turns if t.branch == 0][-1] == 2, shape
    # The generation streaming at the freeze was recorded; the restored harness's retry got it
    # again from the ledger, byte for byte, and the upstream sampled it once.
    assert any(t.replays and t.delivered_run == 2 for t in turns), shape
    _on_policy(turns, model, trajectory)
    return turns


def _on_policy(turns: list[Any], model: ReferenceModelServer, trajectory: Any) -> None:
    """Every sample reproduces under a teacher-forced pass; a linear episode is one sample; the
    API's samples are the ledger's."""
    got = assert_on_policy(turns, model.model)
    live = [t for t in turns if not t.abandoned]
    if all(t.parent_id == p.id for p, t in itertools.pairwise(sorted(live, key=lambda t: t.id))):
        assert_linear(turns, got)
    assert [s.token_ids for s in trajectory.samples] == [s.token_ids for s in got]
    assert [s.loss_mask for s in trajectory.samples] == [s.loss_mask for s in got]
    assert trajectory.prompt_breaks == 0


@pytest.mark.timeout(900)
def test_claude_code_forked_3_ways_mid_episode_gives_3_children_that_succeed_on_policy(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer, harness_images: Path
) -> None:
    """Claude Code, stopped at a snapshot after two recorded turns and forked 3 ways: each child
    finishes; its trajectory begins with the parent's turns, shared up to the fork's snapshot,
    and goes on from them by a fork edge; the children's first turns of their own are three
    samples, not one replayed; every child's turns reproduce under a teacher-forced pass."""
    stack = make_stack(nodes=2, slots=2, upstream=model.url, images=harness_images, model=TOKENS)
    with stack.client() as c:
        parent = c.submit(CLAUDE_SPEC).id
        c.wait(parent, ["RUNNING"], timeout_s=120)
        wait_until(lambda: len(_turns(stack, parent)) >= 2, 180, "two recorded turns")
        snapshot, children = c.fork(parent, 3, now=True, stop=True)
        for child in children:
            final = c.wait(child.id, ["SUCCEEDED", "FAILED"], timeout_s=400)
            assert final.state == "SUCCEEDED" and final.exit_code == 0, (
                final.reason,
                c.trajectory(child.id).verifier_log,
            )
            main = c.trajectory(child.id, include_branches=True).main.turns
            assert main[0].shared and main[0].episode_id == parent and not main[-1].shared
        cursor = next(s for s in c.snapshots(parent) if s.id == snapshot).trajectory_cursor
        c.cancel(parent)
    firsts = []
    for child in children:
        turns = _turns(stack, child.id)
        shared = [t for t in turns if t.shared]
        own = [t for t in turns if not t.shared]
        assert shared and own, [(t.id, t.episode_id, t.shared) for t in turns]
        assert {t.episode_id for t in shared} == {parent} and max(t.id for t in shared) <= cursor["turn"]
        assert any(t.edge == "fork" for t in own), [(t.id, t.edge, t.edge_parent) for t in own]
        assert_on_policy(turns, model.model)
        firsts.append(tuple(min(own, key=lambda t: t.id).token_ids))
    assert len(set(firsts)) == 3, "siblings sample their own first turns"


CLAUDE_SPEC = {
    "image": "harnesses",
    "command": ["sh", "-c", f"mkdir -p /work && cd /work && exec claude -p '{TASK}' --dangerously-skip-permissions"],
    "env": {"HOME": "/root", "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1"},
    "resources": {"memory_mb": 2048},
}  # fmt: skip


def codex_config(gateway_port: int) -> str:
    """The provider entry that points Codex at the gateway."""
    return (
        'model = "reference"\nmodel_provider = "stasis"\n\n[model_providers.stasis]\nname = "stasis"\n'
        f'base_url = "http://169.254.1.1:{gateway_port}/v1"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
    )


@pytest.mark.timeout(900)
def test_codex_survives_preemption_mid_stream(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer, harness_images: Path
) -> None:
    stack = make_stack(nodes=2, slots=1, upstream=model.url, images=harness_images, model=TOKENS)
    assert stack.orchestrator is not None
    spec = {
        "image": "harnesses",
        "command": ["sh", "-c", f"mkdir -p /work && cd /work && exec codex exec {CODEX_FLAGS} '{TASK}'"],
        "env": {"HOME": "/root"},
        "files": {"/root/.codex/config.toml": codex_config(stack.orchestrator.settings.gateway.port)},
        "resources": {"memory_mb": 2048},
    }
    turns = preempted_mid_generation_and_finished(stack, model, spec, "responses")
    assert all(b"event: response.completed" in t.delivered for t in turns)


ANTHROPIC_HARNESS = r"""
import anthropic, json, subprocess, time
client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from Stasis

def ask(**request):
    # The SDK retries a request that fails before its response starts; a stream that breaks
    # midway (its connection came back closed after a restore) is sent again here.
    for attempt in range(20):
        try:
            with client.messages.stream(**request) as stream:
                return stream.get_final_message()
        except Exception as exc:  # the transport's own error types vary by SDK version
            print("retry after", type(exc).__name__, flush=True)
            time.sleep(0.2)
    raise SystemExit("no answer")

tools = [{"name": "shell", "description": "run a shell command",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
messages = [{"role": "user", "content": "Keep notes."}]
for turn in range(8):
    message = ask(model="reference", max_tokens=200, tools=tools, messages=messages)
    print("turn", turn, message.stop_reason, flush=True)
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
    uses = [b for b in message.content if b.type == "tool_use"]
    if not uses:
        messages.append({"role": "user", "content": "go on"})
        continue
    results = []
    for use in uses:
        out = subprocess.run(["sh", "-c", use.input["command"]], capture_output=True, text=True, cwd="/tmp")
        results.append({"type": "tool_result", "tool_use_id": use.id, "content": (out.stdout + out.stderr)[:500] or "ok"})
    messages.append({"role": "user", "content": results})
print("done", flush=True)
"""


@pytest.mark.timeout(900)
def test_anthropic_sdk_harness_survives_three_preemptions(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer, harness_images: Path
) -> None:
    """Each freeze comes while a generation streams."""
    stack = make_stack(nodes=2, slots=1, upstream=model.url, images=harness_images, model=TOKENS)
    with stack.client() as c:
        episode = c.submit({"image": "harnesses", "command": ["python3", "-c", ANTHROPIC_HARNESS]})
        node = c.wait(episode.id, ["RUNNING"], timeout_s=120).node
        for n in range(3):
            try:
                wait_until(
                    under_way(stack, model, episode.id, 2 * n + 1),
                    120,
                    f"a generation after turn {2 * n + 1}",
                )
            except AssertionError:
                e = c.get(episode.id)
                logs = sorted(
                    (stack.state_dir / "nodes").glob(
                        f"*/sandboxes/{e.sandbox_id}/layer/upper/.stasis/harness.log"
                    )
                )
                raise AssertionError(
                    (e.state, [x.reason for x in c.events(episode.id)], [p.read_text()[-3000:] for p in logs])
                ) from None
            c.preempt(episode.id)
            c.wait(episode.id, ["PREEMPTED"], timeout_s=120)
            node = "node-2" if node == "node-1" else "node-1"
            c.resume(episode.id, node=node)
            c.wait(episode.id, ["RUNNING"], timeout_s=120)
        final = c.wait(episode.id, ["SUCCEEDED", "FAILED"], timeout_s=300)
        assert final.state == "SUCCEEDED" and final.runs == 4, final.reason
        trajectory = c.trajectory(episode.id)
        main = trajectory.main
    turns = _turns(stack, episode.id)
    _on_policy(turns, model, trajectory)
    assert len(main.turns) == 8 and len({t.id for t in main.turns}) == 8, "eight turns, each once"
    assert all(
        t.protocol == "messages" and t.delivered.endswith(b'data: {"type":"message_stop"}\n\n') for t in turns
    )
    assert json.loads(turns[0].request_raw)["stream"] is True
