"""SIGKILL the orchestrator at several points of a preemption; a restart loses nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from orchestrator.domain import EpisodeState
from orchestrator.state import SqliteStateStore
from tests.orchestrator.conftest import Cluster, assert_history_is_whole, wait_until
from tests.orchestrator.programs import counter


def _kill_when(cluster: Cluster, episode_id: str, state: str, timeout: float = 60) -> None:
    """SIGKILL the orchestrator as soon as the episode's last transition reaches `state`."""
    with cluster.client() as c:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            transitions = [e for e in c.events(episode_id) if e.kind == "transition"]
            if transitions and transitions[-1].to_state == state:
                cluster.kill_orchestrator()
                return
            time.sleep(0.02)
    raise AssertionError(f"{episode_id} never reached {state}")


def _restart(cluster: Cluster) -> None:
    cluster.start_orchestrator()


@pytest.mark.timeout(300)
def test_orchestrator_killed_during_a_preemption(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(nodes=2, slots=2)
    spec = {
        "image": "base",
        "command": ["python3", "-c", counter(80, memory_mb=64)],
        "resources": {"memory_mb": 512},
    }
    with cluster.client() as c:
        episode = c.submit(spec, request_id="crash-test-submit")
        c.wait(episode.id, ["RUNNING"], timeout_s=60)

        # 1. Killed just after the preempt request: the agent is still freezing and dumping.
        c.preempt(episode.id, reason="crash test 1")
        cluster.kill_orchestrator()
        _restart(cluster)
        held = c.wait(episode.id, ["PREEMPTED"], timeout_s=90)
        assert held.held and held.snapshots == 1

        # 2. Killed right after the restore was committed as intent (RESTORING).
        first_node = c.snapshots(episode.id)[0].node
        other = "node-2" if first_node == "node-1" else "node-1"
        c.resume(episode.id, node=other)
        _kill_when(cluster, episode.id, "RESTORING")
        _restart(cluster)
        resumed = c.wait(episode.id, ["RUNNING"], timeout_s=90)
        assert resumed.node == other

        # 3. Killed while CHECKPOINTING again, then 4. just after PREEMPTED.
        c.preempt(episode.id, reason="crash test 3")
        _kill_when(cluster, episode.id, "CHECKPOINTING")
        _restart(cluster)
        c.wait(episode.id, ["PREEMPTED"], timeout_s=90)
        cluster.kill_orchestrator()
        _restart(cluster)
        assert c.get(episode.id).state == "PREEMPTED"

        c.resume(episode.id)
        c.wait(episode.id, ["RUNNING"], timeout_s=90)
        # A retried submit with the same request id is the same episode, even across a restart.
        assert c.submit(spec, request_id="crash-test-submit").id == episode.id
        assert len(c.episodes()) == 1
        final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=180)
        assert final.exit_code == 0 and final.snapshots == 2
        assert_history_is_whole(c, episode.id, cluster)


@pytest.mark.timeout(240)
def test_orchestrator_killed_at_random_moments(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(nodes=2, slots=2)
    spec = {
        "image": "base",
        "command": ["python3", "-c", counter(80, step_s=0.2)],
        "preemption": {"time_slice_s": 1.0},
    }
    with cluster.client() as c:
        ids = [c.submit(spec).id for _ in range(5)]  # 5 episodes, 4 slots: time-slicing never stops
        for delay in (0.3, 1.1, 0.7, 1.9, 0.5):
            time.sleep(delay)
            cluster.kill_orchestrator()
            _restart(cluster)
        for episode_id in ids:
            assert c.wait(episode_id, ["SUCCEEDED"], timeout_s=200).exit_code == 0
        for episode_id in ids:
            assert_history_is_whole(c, episode_id, cluster)
        wait_until(lambda: all(not n.episodes for n in c.nodes()), 30, "nodes to be empty")


@pytest.mark.timeout(180)
def test_intent_committed_but_never_sent_is_carried_out(make_cluster: Callable[..., Cluster]) -> None:
    """The orchestrator dies after committing CHECKPOINTING and before its request leaves."""
    cluster = make_cluster(nodes=1, slots=1)
    with cluster.client() as c:
        episode = c.submit({"image": "base", "command": ["python3", "-c", counter(400)]})
        c.wait(episode.id, ["RUNNING"], timeout_s=60)
        cluster.kill_orchestrator()
        store = SqliteStateStore(cluster.state_dir / "state.db")
        store.episodes.transition(
            episode.id, EpisodeState.CHECKPOINTING, "manual: asked just before the crash",
            pending_snapshot_id=f"{episode.id}-s1", pending_reason="manual",
        )  # fmt: skip
        store.close()
        _restart(cluster)
        held = c.wait(episode.id, ["PREEMPTED"], timeout_s=90)
        assert held.held and held.last_snapshot_id == f"{episode.id}-s1"
        c.cancel(episode.id)
