"""The control loop driven in-process, tick by tick, for the `test_control_*` tests: a real state
store, a real snapshot store, and node agents replaced by the boundary fake in `fakes`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.control import Control, ControlSettings
from orchestrator.control.verifier import Verifier
from orchestrator.domain import EpisodeSpec, EpisodeState, NodeRecord, NodeState, Reason
from orchestrator.state import SqliteStateStore
from orchestrator.trajectory import Ledger
from snapshots import SnapshotStore
from tests.orchestrator.fakes import FakeAgent, FakeAgents

S = EpisodeState
SPEC = EpisodeSpec(image="base", command=("python3", "agent.py"))
SETTINGS = ControlSettings(
    tick_s=0.02, retry_backoff_s=0.05, heartbeat_interval_s=0.05, node_lost_after_s=30, gc_interval_s=3600
)


class Loop:
    """A control loop driven tick by tick, with two fake nodes that report on every tick."""

    def __init__(
        self, root: Path, settings: ControlSettings = SETTINGS, agents: FakeAgents | None = None
    ) -> None:
        self.root = root
        self.store = SqliteStateStore(root / "state.db")
        self.snapshots = SnapshotStore.open(f"file://{root / 'snapshots'}")
        self.agents = agents or FakeAgents(self.snapshots)
        self.ledger = Ledger.sqlite(root / "ledger.db")
        # The real verifier, run by the fake agents: a spec with a reward section gets the
        # reward its verifier prints (`FakeAgents.verifier_logs`).
        finish = Verifier(self.agents, self.ledger)
        self.control = Control(
            settings, self.store, self.snapshots, self.agents, finish=finish, ledger=self.ledger
        )
        self.silent: set[str] = set()

    def register(self, *names: str) -> None:
        for name in names:
            node = NodeRecord(
                name, f"{name}:1", NodeState.READY, "runc", 2, 8192, {"sha256:b": ["base"]}, {}, 0,
                restores_forks=True,
            )  # fmt: skip
            self.control.members.registered(node, [])

    def node(self, name: str) -> FakeAgent:
        return self.agents.get(name)

    def report(self) -> None:
        for name, agent in self.agents.agents.items():
            if name not in self.silent:
                self.control.members.heartbeat(name, agent.views(), {"sha256:b": ["base"]})

    def until(self, what: str, predicate: Callable[[], object], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.report()
            self.control.tick()
            time.sleep(0.02)
            if not self.control.work.busy() and predicate():
                return
        raise AssertionError(f"timed out waiting for {what}; episodes: {self.store.episodes.query()}")

    def state(self, episode_id: str) -> EpisodeState:
        return self.store.episodes.get(episode_id).state

    def running(self, spec: EpisodeSpec = SPEC) -> str:
        e = self.store.episodes.submit(spec, "", self.control.pool_of_addresses)
        self.until("RUNNING", lambda: self.state(e.id) == S.RUNNING)
        return e.id

    def close(self) -> None:
        self.control.stop()
        self.snapshots.close()
        self.ledger.close()
        self.store.close()


def saved(loop: Loop, episode_id: str, n: int) -> None:
    loop.control.operations.begin_checkpoint(episode_id, Reason.AUTOSAVE, f"save {n}", leave_running=True)
    loop.until(f"snapshot {n}", lambda: loop.store.episodes.get(episode_id).snapshots == n)


class Aborted(Exception):
    """What the stand-in for gRPC's servicer context raises where the real one ends the call."""


class Context:
    def abort(self, code: object, details: str) -> None:
        raise Aborted(code, details)
