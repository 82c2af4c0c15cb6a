"""Two orchestrators on one PostgreSQL database: one leads, the other stands by, serving reads,
and takes over when the leader is SIGKILLed in the middle of a preemption. The standby completes
the preemption with nothing lost or done twice, and the episode runs on to a clean finish.

Everything is real: the suite's PostgreSQL (`tests/postgres.py`), both orchestrators and both
agents as processes with the cluster's certificates, and runc sandboxes."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.domain import TemporaryError
from tests.faults import silent_link
from tests.orchestrator.conftest import Cluster, assert_history_is_whole, wait_until
from tests.orchestrator.programs import counter
from tests.postgres import HOSTS, PostgresServer

SERVING = health_pb2.HealthCheckResponse.SERVING


def _serving(cluster: Cluster, replica: int, service: str = "stasis.v1.Stasis") -> bool:
    """What the replica's gRPC health says of `service`, asked as the kubelet's readiness probe
    asks: in plaintext, on the health port (`--health-listen`)."""
    with grpc.insecure_channel(cluster.health_addresses[replica]) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return reply.status == SERVING


def _ready(cluster: Cluster, replica: int) -> bool:
    """As a readiness probe judges: a replica that does not answer is not ready either."""
    try:
        return _serving(cluster, replica)
    except grpc.RpcError:
        return False


LEASE_TERM_S = 7
"""How soon after its link to the database goes silent a leader must stop being ready: the
server frees the lease for a standby 5 to 7 s after it last heard from the leader
(`postgres_database.SERVER_KEEPALIVE`), and a standby may lead from then on."""


@pytest.mark.timeout(300)
def test_the_standby_completes_a_preemption_when_the_leader_dies(
    make_cluster: Callable[..., Cluster], postgres: PostgresServer
) -> None:
    cluster = make_cluster(nodes=2, slots=2, database_url=postgres.database(), replicas=2)
    spec = {"image": "base", "command": ["python3", "-c", counter(60, memory_mb=64)]}
    assert _serving(cluster, 0) and not _serving(cluster, 1), "only the leader is ready"
    assert _serving(cluster, 1, ""), "the standby is alive"

    with cluster.client(0) as leader, cluster.client(1, retry_for_s=0) as standby:
        episode = leader.submit(spec, request_id="takeover-submit")
        leader.wait(episode.id, ["RUNNING"], timeout_s=60)

        # The standby reads the shared database, and refuses writes, naming the leader.
        assert standby.get(episode.id).state == "RUNNING"
        assert {n.name for n in standby.nodes()} == {"node-1", "node-2"}
        with pytest.raises(TemporaryError, match=f"stands by.*leader is .*{cluster.addresses[0]}"):
            standby.submit(spec)
        with pytest.raises(TemporaryError, match="stands by"):
            standby.cancel(episode.id)
        assert [e.id for e in standby.episodes()] == [episode.id], "the refused submit stored nothing"

        # The leader dies while the agent is still freezing and dumping.
        leader.preempt(episode.id, reason="takeover test")
        cluster.kill_orchestrator(0)

    with cluster.client(1) as c:
        held = c.wait(episode.id, ["PREEMPTED"], timeout_s=90)
        assert held.held and held.snapshots == 1
        assert _serving(cluster, 1), "the new leader is ready"
        transitions = [e.to_state for e in c.events(episode.id) if e.kind == "transition"]
        assert transitions.count("CHECKPOINTING") == 1 and transitions.count("PREEMPTED") == 1, transitions

        # Nodes moved to the new leader: it places the resumed run on exactly one of them.
        c.resume(episode.id)
        running = c.wait(episode.id, ["RUNNING"], timeout_s=90)
        wait_until(
            lambda: [n.name for n in c.nodes() if episode.id in n.episodes] == [running.node],
            30,
            "the new leader to hear from the node that runs the episode",
        )
        assert c.submit(spec, request_id="takeover-submit").id == episode.id, "request ids survive"
        assert len(c.episodes()) == 1

        final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=120)
        assert final.exit_code == 0, "memory and files came through the takeover intact"
        assert final.snapshots == 1
        assert_history_is_whole(c, episode.id, cluster)


@pytest.mark.timeout(120)
def test_a_restarted_leader_stands_by_while_the_other_leads(
    make_cluster: Callable[..., Cluster], postgres: PostgresServer
) -> None:
    """The lease moves once, to the survivor: the old leader, back, does not take it again."""
    cluster = make_cluster(nodes=1, slots=1, database_url=postgres.database(), replicas=2)
    cluster.kill_orchestrator(0)
    wait_until(lambda: _serving(cluster, 1), 30, "the standby to take over")
    cluster.start_orchestrator(0)
    assert not _serving(cluster, 0) and _serving(cluster, 1)
    with (
        cluster.client(0, retry_for_s=0) as back,
        pytest.raises(TemporaryError, match=f"leader is .*{cluster.addresses[1]}.*term 2"),
    ):
        back.submit({"image": "base", "command": ["true"]})
    with cluster.client(1) as c:
        wait_until(lambda: [n.state for n in c.nodes()] == ["READY"], 30, "the node to follow the leader")
        done = c.wait(c.submit({"image": "base", "command": ["true"]}).id, ["SUCCEEDED"], timeout_s=60)
        assert done.exit_code == 0


@pytest.mark.timeout(240)
def test_a_leader_whose_database_link_goes_silent_stops_within_the_lease_term(
    make_cluster: Callable[..., Cluster], postgres: PostgresServer
) -> None:
    """The link between the leader and PostgreSQL starts dropping every packet: no reset, no
    error. The leader stops being ready before the lease can pass to the standby, and exits; its
    node moves to the new leader in time, so the episode runs on, never declared lost."""
    url = postgres.database()
    cut_off = postgres.url(url.rsplit("/", 1)[1], HOSTS[1])
    cluster = make_cluster(nodes=1, slots=1, lost_after=10, database_url=[cut_off, url], replicas=2)
    spec = {"image": "base", "command": ["python3", "-c", counter(160)]}  # 40 s: past the takeover
    with cluster.client(0) as c:
        episode = c.submit(spec)
        c.wait(episode.id, ["RUNNING"], timeout_s=60)

    with silent_link(HOSTS[1], postgres.port):
        silenced = time.monotonic()
        stopped = led = 0.0
        while not led and time.monotonic() - silenced < 60:
            stopped = stopped or (0.0 if _ready(cluster, 0) else time.monotonic() - silenced)
            led = 0.0 if not _ready(cluster, 1) else time.monotonic() - silenced
            time.sleep(0.1)
        print(f"the cut-off leader stopped after {stopped:.1f} s; the standby led after {led:.1f} s")
        assert stopped, "the cut-off leader was still ready beside the new leader"
        assert stopped < LEASE_TERM_S and (not led or stopped < led), "two replicas were ready at once"
        assert led, "the standby never led"
        leader = cluster.orchestrators[0]
        assert leader is not None and leader.wait(timeout=30) == 1, "it exits, to come back standing by"

    with cluster.client(1) as c:
        time.sleep(cluster.lost_after + 2)  # longer than a node may go unheard
        assert [n.state for n in c.nodes()] == ["READY"], "the node followed the new leader in time"
        final = c.wait(episode.id, ["SUCCEEDED"], timeout_s=120)
        assert final.exit_code == 0
        transitions = [e.to_state for e in c.events(episode.id) if e.kind == "transition"]
        assert transitions.count("RUNNING") == 1, f"the episode ran once, never recovered: {transitions}"
