"""Agent episodes through the gateway, for real: preemptions across nodes, an in-flight request
at freeze time, the official openai SDK in an imported image, isolation and rewards."""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.local import LocalStack
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings, decode
from tests.orchestrator.conftest import REPO, cli, import_image, link_base_tree, wait_until
from tests.orchestrator.models import TOKENS, slow_model, under_way
from tests.orchestrator.onpolicy import assert_linear, assert_on_policy

HARNESS = (REPO / "examples" / "harness" / "agent.py").read_bytes()
GRADER = b"""\
import json, os
progress = json.load(open("/episode/work/progress.json"))
print("turns=%d status=%s" % (progress["turn"], progress["status"]))
print(1.0 if progress["status"] == "answered" else 0.0)
"""


@pytest.fixture
def model() -> Iterator[ReferenceModelServer]:
    server = ReferenceModelServer(ReferenceModelSettings(seed=11, mean_tool_turns=14)).start()
    yield server
    server.stop()


def harness_spec(**env: str) -> dict[str, Any]:
    return {
        "image": "base",
        "command": ["python3", "/harness/agent.py"],
        "env": {"HARNESS_MAX_TURNS": "60", **env},
        "files": {"/harness/agent.py": HARNESS.decode()},
        "resources": {"cpus": 0.5, "memory_mb": 512},
        "reward": {
            "command": ["python3", "/grader/grade.py"],
            "files": {"/grader/grade.py": GRADER.decode()},
        },
    }


def _main_chain_is_whole(turns: list[Any]) -> None:
    assert len({t.id for t in turns}) == len(turns), "a turn appears twice"
    assert all(t.index == i for i, t in enumerate(turns))
    for parent, child in itertools.pairwise(turns):
        assert child.parent_id == parent.id, "a gap in the main branch"


@pytest.mark.timeout(420)
def test_example_harness_through_three_preemptions(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    stack = make_stack(nodes=2, slots=1, upstream=model.url)
    with stack.client() as c:
        # Slow enough that three preemptions (each a few seconds on a busy machine) land well
        # before the model's mean of 14 tool turns is reached.
        episode = c.submit(harness_spec(HARNESS_STEP_DELAY_S="1.0"))
        nodes = []
        for target in ("node-2", "node-1", "node-2"):
            running = c.wait(episode.id, ["RUNNING"], timeout_s=90)
            nodes.append(running.node)
            wait_until(lambda: c.trajectory(episode.id).main.turns, 60, "a turn")
            time.sleep(1.5)
            c.preempt(episode.id, reason="e2e")
            c.wait(episode.id, ["PREEMPTED"], timeout_s=90)
            c.resume(episode.id, node=target if target != nodes[-1] else "")
        nodes.append(c.wait(episode.id, ["RUNNING"], timeout_s=90).node)
        final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=240)
        assert final.snapshots == 3 and final.reward == 1.0
        assert {"node-1", "node-2"} <= set(nodes)

        t = c.trajectory(episode.id, include_branches=True)
        completed = int(t.verifier_log.split("turns=")[1].split()[0])
        turns = t.main.turns
        _main_chain_is_whole(turns)
        assert len(turns) == completed, "exactly one turn per request the harness completed"
        assert not any(b.turns and not b.abandoned for b in t.branches), (
            "a single-threaded harness has one live branch"
        )
        # Each recorded log-prob is what the model server returned for that sampled token.
        for turn, record in zip(
            turns, [tt for tt in _ledger_turns(stack, episode.id) if tt.branch == 0], strict=True
        ):
            body = json.loads(record.request_raw)
            scored = model.model.score_chat(body, turn.token_ids)
            assert [d.logprob(tok) for d, tok in zip(scored, turn.token_ids, strict=True)] == turn.logprobs
            returned = json.loads(record.response)["choices"][0]["logprobs"]["content"]
            assert [e["logprob"] for e in returned] == turn.logprobs
        # Every sampled token is trained in exactly one sample, with the log-prob it was sampled with.
        for sample in t.samples:
            assert len(sample.token_ids) == len(sample.logprobs) == len(sample.loss_mask)
        assert sorted(i for s in t.samples for i in s.turn_ids) == sorted(tt.id for tt in turns)
        assert sum(sum(s.loss_mask) for s in t.samples) == sum(len(tt.token_ids) for tt in turns)

        data = json.loads(cli(stack, "trajectory", episode.id, "-o", "json").stdout)
        assert data["reward"] == 1.0 and len([x for x in data["turns"] if x["branch"] == 0]) == completed
        assert len(data["samples"]) == len(t.samples) and data["prompt_breaks"] == t.prompt_breaks
        for key in ("index", "branch", "replayed", "token_ids", "logprobs", "policy_version"):
            assert all(key in x for x in data["turns"]), key


def _ledger_turns(stack: LocalStack, episode_id: str) -> list[Any]:
    assert stack.orchestrator is not None
    return stack.orchestrator.ledger.turns(episode_id)


class SlowUpstream:
    """A proxy that holds every model response for `delay_s`, so a request is in flight at freeze time."""

    def __init__(self, target: str, delay_s: float) -> None:
        import http.server
        import urllib.request

        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                outer.requests += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = urllib.request.Request(
                    target + self.path.removeprefix("/v1"),
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req) as resp:
                    data, version = resp.read(), resp.headers.get("x-policy-version", "")
                time.sleep(delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-policy-version", version)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


IN_FLIGHT = r"""
import hashlib, json, os, time, urllib.request
body = json.dumps({"model": "reference", "messages": [{"role": "user", "content": "one question"}], "seed": 9}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
attempt = 0
while True:
    attempt += 1
    print("attempt", attempt, flush=True)
    try:
        data = opener.open(req, timeout=60).read()
        break
    except Exception as exc:
        print("retry after", type(exc).__name__, flush=True)
        time.sleep(0.2)
print("sha", hashlib.sha256(data).hexdigest(), flush=True)
print(hashlib.sha256(data).hexdigest())
"""


@pytest.mark.timeout(240)
def test_request_in_flight_at_freeze_is_served_from_the_ledger(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    slow = SlowUpstream(model.url, delay_s=4.0)
    try:
        stack = make_stack(nodes=2, slots=1, upstream=slow.url)
        assert stack.orchestrator is not None and stack.orchestrator.gateway is not None
        # The gateway's one check of the model server, done before the harness's request is counted.
        assert stack.orchestrator.gateway.logprobs_mode("reference") == "processed"
        slow.requests = 0
        with stack.client() as c:
            spec = {
                "image": "base",
                "command": ["python3", "-c", IN_FLIGHT],
                # The reward is the sha of the bytes the harness finally received, read back by the verifier.
                "reward": {
                    "command": ["sh", "-c", "grep ^sha /episode/.stasis/harness.log | tail -1; echo 1"]
                },
            }
            episode = c.submit(spec)
            first = c.wait(episode.id, ["RUNNING"], timeout_s=60).node
            wait_until(lambda: slow.requests == 1, 30, "the request to reach the model server")
            c.preempt(episode.id)  # the harness is blocked on its request: it is frozen mid-flight
            c.wait(episode.id, ["PREEMPTED"], timeout_s=60)
            c.resume(episode.id, node="node-2" if first == "node-1" else "node-1")
            final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=120)
            assert final.runs == 2
            (turn,) = _ledger_turns(stack, episode.id)
            assert turn.replays >= 1, "the retried request was answered from the ledger"
            assert slow.requests == 1, "and never sampled twice"
            log = c.trajectory(episode.id).verifier_log
            assert f"sha {hashlib.sha256(turn.response).hexdigest()}" in log, "byte for byte"
            assert c.trajectory(episode.id).main.turns[0].replayed
    finally:
        slow.stop()


OPENAI_HARNESS = r"""
import json, os, time
from openai import OpenAI
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from Stasis

def ask(turn, messages):
    # Even turns stream chat completions, odd ones stream the Responses API. A stream that breaks
    # midway (its connection came back closed after a restore) is sent again.
    for attempt in range(20):
        try:
            if turn % 2 == 0:
                chunks = client.chat.completions.create(model="reference", messages=messages, max_tokens=12, stream=True)
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            with client.responses.stream(model="reference", input=messages, max_output_tokens=12) as stream:
                return stream.get_final_response().output_text
        except Exception as exc:  # the transport's own error types vary by SDK version
            print("retry after", type(exc).__name__, flush=True)
            time.sleep(0.2)
    raise SystemExit("no answer")

messages = [{"role": "user", "content": "count to three"}]
for turn in range(8):
    text = ask(turn, messages)
    messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": "go on"})
    print("turn", turn, flush=True)
    time.sleep(1.0)
json.dump({"turns": 8}, open("/result.json", "w"))
"""


@pytest.fixture(scope="module")
def openai_image(tmp_path_factory: pytest.TempPathFactory, base_images: Path) -> Path:
    """The base image plus the official openai SDK, as a directory to import."""
    root = tmp_path_factory.mktemp("openai-image") / "rootfs"
    link_base_tree(base_images, root)
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(site), "--python-version", "3.11"]
    subprocess.run([*pip, "--only-binary=:all:", "--no-compile", "openai"], check=True)
    return root


@pytest.mark.timeout(420)
def test_official_openai_sdk_harness_survives_three_preemptions(
    make_stack: Callable[..., LocalStack], openai_image: Path
) -> None:
    """Chat completions and the Responses API, streamed, in turn; each freeze comes while a
    generation streams, and the episode is one sample a teacher-forced pass reproduces."""
    model = slow_model()
    try:
        stack = make_stack(nodes=2, slots=1, upstream=model.url, model=TOKENS)
        for name in stack.agents:
            import_image(stack, name, openai_image, "openai")
        with stack.client() as c:
            episode = c.submit(
                {
                    "image": "openai",
                    "command": ["python3", "-c", OPENAI_HARNESS],
                    # The verifier reads the harness's log: the SDK's own output, then the reward.
                    "reward": {"command": ["sh", "-c", "grep -c ^turn /episode/.stasis/harness.log"]},
                }
            )
            node = c.wait(episode.id, ["RUNNING"], timeout_s=60).node
            for n in range(3):
                wait_until(
                    under_way(stack, model, episode.id, 2 * n + 1),
                    60,
                    f"a generation after turn {2 * n + 1}",
                )
                c.preempt(episode.id)
                c.wait(episode.id, ["PREEMPTED"], timeout_s=60)
                node = "node-2" if node == "node-1" else "node-1"
                c.resume(episode.id, node=node)
                c.wait(episode.id, ["RUNNING"], timeout_s=60)
            final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=120)
            assert final.exit_code == 0 and final.reward == 8.0 and final.runs == 4, (
                "the harness printed eight turns"
            )
            turns = c.trajectory(episode.id).main.turns
            assert len(turns) == 8 and len({t.id for t in turns}) == 8
        recorded = _ledger_turns(stack, episode.id)
        assert [t.protocol for t in recorded] == ["chat", "responses"] * 4
        assert_linear(recorded, assert_on_policy(recorded, model.model))
    finally:
        model.stop()


RESTYLING_HARNESS = r"""
import json, os, subprocess, time, urllib.request

def ask(messages):
    # Streamed chat completions; a stream that breaks midway (its connection came back closed
    # after a restore) is sent again.
    body = json.dumps({"model": "reference", "messages": messages, "tools": TOOLS, "stream": True}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    for attempt in range(20):
        try:
            content, calls, done = "", [], False
            with urllib.request.urlopen(request, timeout=120) as response:
                for line in response:
                    if line.startswith(b"data: {"):
                        choices = json.loads(line[6:])["choices"]
                        delta = choices[0]["delta"] if choices else {}
                        content += delta.get("content") or ""
                        calls += delta.get("tool_calls") or []
                    done = done or line.startswith(b"data: [DONE]")
            if not done:  # a stream cut short is no answer: ask again
                raise ConnectionError("the stream ended before [DONE]")
            return content, calls
        except Exception as exc:
            print("retry after", type(exc).__name__, flush=True)
            time.sleep(0.2)
    raise SystemExit("no answer")

TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a shell command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Keep notes."}]
for turn in range(8):
    content, calls = ask(messages)
    # Its own style: sorted keys, indentation, null for no text.
    messages.append({"role": "assistant", "content": content or None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
         "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=2, sort_keys=True)}} for c in calls]})
    for c in calls:
        out = subprocess.run(["sh", "-c", json.loads(c["function"]["arguments"])["command"]], capture_output=True,
                             text=True, cwd="/tmp")
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": (out.stdout + out.stderr)[:300] or "ok"})
    if not calls:
        messages.append({"role": "user", "content": "go on"})
    print("turn", turn, len(calls), flush=True)
"""


@pytest.mark.timeout(300)
def test_a_harness_that_restyles_tool_calls_stays_on_policy_across_a_preemption(
    make_stack: Callable[..., LocalStack],
) -> None:
    """A harness that re-serialises every tool call in its own style, frozen while a generation
    streams: the model is prompted with the tokens it sampled, never the harness's rewrite."""
    model = slow_model()
    try:
        stack = make_stack(nodes=2, slots=1, upstream=model.url, model=TOKENS)
        with stack.client() as c:
            episode = c.submit({"image": "base", "command": ["python3", "-c", RESTYLING_HARNESS]})
            first = c.wait(episode.id, ["RUNNING"], timeout_s=60).node
            wait_until(under_way(stack, model, episode.id, 3), 120, "a generation after turn 3")
            c.preempt(episode.id)
            c.wait(episode.id, ["PREEMPTED"], timeout_s=60)
            c.resume(episode.id, node="node-2" if first == "node-1" else "node-1")
            final = c.wait(episode.id, ["SUCCEEDED", "FAILED"], timeout_s=180)
            assert final.state == "SUCCEEDED" and final.runs == 2, final.reason
            trajectory = c.trajectory(episode.id)
        turns = _ledger_turns(stack, episode.id)
        assert len([t for t in turns if not t.abandoned]) == 8 and any(t.replays for t in turns)
        assert_linear(turns, assert_on_policy(turns, model.model))
        assert trajectory.prompt_breaks == 0 and len(trajectory.samples) == 1
        assert '\n  "command"' not in decode(turns[-1].prompt_token_ids), (
            "the harness's style never reaches the model"
        )
    finally:
        model.stop()


ISOLATION = r"""
import os, socket, sys, urllib.request
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "open"
    except OSError as exc:
        return type(exc).__name__
gateway = os.environ["OPENAI_BASE_URL"].split("//")[1].split("/")[0]
host, port = gateway.split(":")
print("gateway", reach(host, int(port)), flush=True)
for target in sys.argv[1:]:
    h, p = target.split(":")
    print("other", target, reach(h, int(p)), flush=True)
hidden = [p for p in ("/grader", "/grader/grade.py") if os.path.exists(p)]
print("hidden files seen:", hidden, flush=True)
open("/work-result", "w").write("done")
"""


@pytest.mark.timeout(180)
def test_sandbox_reaches_only_the_gateway_and_never_sees_reward_files(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    stack = make_stack(nodes=1, slots=2, upstream=model.url)
    # Servers the sandbox must not reach: another port on the gateway's own address, the host's
    # loopback (which inside the sandbox is the sandbox's own), and a neighbouring sandbox.
    servers = [socket.create_server((addr, 0)) for addr in ("169.254.1.1", "127.0.0.1")]
    targets = [f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in servers]
    neighbour_server = (
        "import socket\ns = socket.create_server(('0.0.0.0', 9000))\nwhile True:\n    s.accept()[0].close()\n"
    )
    try:
        with stack.client() as c:
            neighbour = c.submit({"image": "base", "command": ["python3", "-c", neighbour_server]})
            neighbour_address = c.wait(neighbour.id, ["RUNNING"], timeout_s=60).address
            # The neighbour's server is up: the node itself reaches it.
            wait_until(lambda: _connects(neighbour_address, 9000), 30, "the neighbour's server")
            targets.append(f"{neighbour_address}:9000")
            grader = "import os\nprint('saw harness output:', os.path.exists('/episode/work-result'))\nprint(0.5)\n"
            episode = c.submit(
                {
                    "image": "base",
                    "command": ["python3", "-c", ISOLATION, *targets],
                    "reward": {
                        "command": ["sh", "-c", "cat /episode/.stasis/harness.log; python3 /grader/grade.py"],
                        "files": {"/grader/grade.py": grader},
                    },
                }
            )
            final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=90)
            assert final.reward == 0.5
            log = c.trajectory(episode.id).verifier_log
            assert "saw harness output: True" in log
            assert "gateway open" in log
            for target in targets:
                assert f"other {target} " in log and f"other {target} open" not in log
            assert "hidden files seen: []" in log
            c.cancel(neighbour.id)
    finally:
        for s in servers:
            s.close()


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_crashing_verifier_fails_the_episode(
    make_stack: Callable[..., LocalStack], model: ReferenceModelServer
) -> None:
    stack = make_stack(nodes=1, slots=1, upstream=model.url)
    with stack.client() as c:
        crash = c.submit(
            {
                "image": "base",
                "command": ["true"],
                "reward": {"command": ["sh", "-c", "echo boom >&2; exit 4"]},
            }
        )
        no_number = c.submit(
            {"image": "base", "command": ["true"], "reward": {"command": ["echo", "great job"]}}
        )
        for episode_id, words in ((crash.id, "exit code 4"), (no_number.id, "'great job' is not a number")):
            with pytest.raises(Exception, match="FAILED"):
                c.wait(episode_id, ["SUCCEEDED"], timeout_s=90)
            failed = c.get(episode_id)
            assert failed.state == "FAILED" and failed.reward is None and words in failed.reason
