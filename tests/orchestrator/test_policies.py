"""Time-slicing, drain and node loss against a real local stack."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from orchestrator import StasisClient
from orchestrator.cli.local import AgentProcess, LocalStack
from tests.orchestrator.conftest import remove_node_sandboxes, wait_until
from tests.orchestrator.programs import counter_spec


def _transitions(client: StasisClient, episode_id: str) -> list[tuple[str, str, str]]:
    return [(e.from_state, e.to_state, e.reason) for e in client.events(episode_id) if e.kind == "transition"]


@pytest.mark.timeout(240)
def test_time_slicing_lets_every_episode_progress(make_stack: Callable[..., LocalStack]) -> None:
    stack = make_stack(nodes=2, slots=1)
    with stack.client() as client:
        ids = [client.submit(counter_spec(32, time_slice_s=2.0)).id for _ in range(3)]
        for episode_id in ids:
            client.wait(episode_id, ["SUCCEEDED"], timeout_s=180)
        for episode_id in ids:
            moves = _transitions(client, episode_id)
            preempted = [m for m in moves if m[1] == "PREEMPTED"]
            restored = [m for m in moves if m[0] == "RESTORING" and m[1] == "RUNNING"]
            assert preempted and all(m[2].startswith("time-slice") for m in preempted), moves
            assert restored, moves
            assert client.get(episode_id).exit_code == 0
        decisions = [e for e in client.events() if e.kind == "transition" and e.to_state == "CHECKPOINTING"]
        assert all("slice while ep-" in e.reason for e in decisions)


@pytest.mark.timeout(180)
def test_drain_moves_episodes_to_the_other_node(make_stack: Callable[..., LocalStack]) -> None:
    stack = make_stack(nodes=2, slots=2)
    with stack.client() as client:
        client.drain("node-2")
        ids = [client.submit(counter_spec(60)).id for _ in range(2)]
        for episode_id in ids:
            assert client.wait(episode_id, ["RUNNING"], timeout_s=60).node == "node-1"
        client.uncordon("node-2")
        client.drain("node-1")
        for episode_id in ids:
            wait_until(
                lambda e=episode_id: client.get(e).node == "node-2" and client.get(e).state == "RUNNING",
                90,
                "move",
            )
        assert {n.name: n.state for n in client.nodes()} == {"node-1": "DRAINING", "node-2": "READY"}
        assert next(n for n in client.nodes() if n.name == "node-1").episodes == []
        for episode_id in ids:
            assert [s.reason for s in client.snapshots(episode_id)] == ["drain"]
            client.wait(episode_id, ["SUCCEEDED"], timeout_s=120)


@pytest.mark.timeout(240)
def test_an_agent_asked_to_stop_has_its_node_drained_first(make_stack: Callable[..., LocalStack]) -> None:
    """What a node being taken away does (`--drain-on-stop`, as the Helm chart runs agents): on
    SIGTERM its agent asks to be drained, stays until its sandboxes have moved, then exits."""
    stack = make_stack(nodes=2, slots=2)
    with stack.client() as client:
        client.drain("node-2")
        episode = client.submit(counter_spec(60))
        assert client.wait(episode.id, ["RUNNING"], timeout_s=60).node == "node-1"
        client.uncordon("node-2")
        agent = stack.agents["node-1"]
        agent.stop()  # its sandboxes go on running; the agent restarts with the flag
        leaving = AgentProcess(agent.name, [*agent.argv, "--drain-on-stop", "120"], agent.log_path)
        stack.agents["node-1"] = leaving
        logged = agent.log_path.stat().st_size
        leaving.start()
        assert leaving.process is not None
        wait_until(
            lambda: b"registered" in agent.log_path.read_bytes()[logged:], 30, "the agent to register again"
        )
        leaving.process.send_signal(signal.SIGTERM)
        wait_until(
            lambda: client.get(episode.id).node == "node-2" and client.get(episode.id).state == "RUNNING",
            120,
            "the episode to move before the agent stops",
        )
        assert leaving.process.wait(timeout=60) == 0
        assert {n.name: n.state for n in client.nodes()}["node-1"] == "DRAINING"
        assert any(e.reason == "its agent is stopping" for e in client.events() if e.kind == "node")
        assert [s.reason for s in client.snapshots(episode.id)] == ["drain"]


@pytest.mark.timeout(240)
def test_lost_node_resumes_episodes_from_their_last_snapshot(make_stack: Callable[..., LocalStack]) -> None:
    """Node death is simulated: its agent is SIGKILLed and its sandboxes are removed, as a dead machine's would be."""
    stack = make_stack(nodes=2, slots=2, node_lost_after_s=3.0)
    with stack.client() as client:
        episode = client.submit(counter_spec(80, autosave_s=1.5))
        running = client.wait(episode.id, ["RUNNING"], timeout_s=60)
        wait_until(lambda: client.get(episode.id).snapshots >= 1, 60, "an autosave")
        victim = running.node
        stack.agents[victim].kill()
        remove_node_sandboxes(stack.state_dir / "nodes" / victim)
        survivor = "node-2" if victim == "node-1" else "node-1"
        wait_until(
            lambda: client.get(episode.id).node == survivor and client.get(episode.id).state == "RUNNING",
            60,
            "resume",
        )
        lost = [e for e in client.events(episode.id) if "was lost" in e.reason]
        assert lost and "resuming from snapshot" in lost[0].reason
        assert {n.name: n.state for n in client.nodes()}[victim] == "LOST"
        assert client.wait(episode.id, ["SUCCEEDED"], timeout_s=120).exit_code == 0

        stack.agents[victim].start()
        wait_until(
            lambda: {n.name: n.state for n in client.nodes()}[victim] == "READY", 60, "the node to return"
        )


# The reward a verifier reads from the member's final files: the steps it counted, out of 100.
COUNTED = ["python3", "-c", "print(len(open('/episode/work/steps.log').read().split()) / 100)"]


@pytest.mark.timeout(300)
def test_a_group_of_8_with_a_members_node_lost_completes_with_8_real_rewards(
    make_stack: Callable[..., LocalStack],
) -> None:
    """A GRPO group of 8 runs across both nodes; one node dies outright. Its members resume on the
    other from their snapshots (or start again), none is ended by the infrastructure, and the
    group completes with each member's reward as its own verifier computed it."""
    stack = make_stack(nodes=2, slots=4, node_lost_after_s=3.0)
    spec = counter_spec(40, autosave_s=2.0) | {"reward": {"command": COUNTED}}
    spec["resources"] |= {"disk_mb": 1024}  # 8 members and their verifiers fit one node's disk
    with stack.client() as client:
        members = [m.id for m in client.submit_group(spec, 8, "g-lost", "count-40")]
        running = {m: client.wait(m, ["RUNNING"], timeout_s=120) for m in members}
        victim = running[members[0]].node
        on_victim = [m for m in members if running[m].node == victim]
        assert 0 < len(on_victim) < 8, {m: r.node for m, r in running.items()}
        wait_until(lambda: all(client.get(m).snapshots >= 1 for m in on_victim), 60, "an autosave of each")
        stack.agents[victim].kill()
        remove_node_sandboxes(stack.state_dir / "nodes" / victim)
        for m in members:
            assert client.wait(m, ["SUCCEEDED"], timeout_s=240).exit_code == 0, m
        for m in on_victim:
            assert any("was lost" in e.reason for e in client.events(m)), f"{m} was on the lost node"
            assert client.get(m).node != victim
        (group,) = client.groups("g-lost")
        assert group.complete and not group.broken and group.final == 8
        assert group.rewards == [0.4] * 8, "every member's own verifier counted its 40 steps"
