"""Boundary fakes for the control loop's in-process tests.

`FakeAgent` stands in for a node agent at the `NodeAgent` protocol, the boundary between the
control plane and a node: it keeps sandboxes as records instead of running containers. Its
snapshots are real, written to the real snapshot store, so the control loop's store reads
(settling a lost reply, falling back to a parent) run against the real thing. The runtime
behind a real agent is tested for real in tests/sandbox_agent and by the end-to-end tests.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.control import (
    AgentUnavailable,
    CheckpointOutcome,
    ImageView,
    RestoreIdentity,
    SandboxState,
    SandboxView,
    SnapshotDamaged,
    SnapshotTarget,
    SpecRefused,
    VerifierResult,
)
from orchestrator.domain import EpisodeSpec, NotFound, PullStatus, StasisError, ids
from snapshots import SnapshotCorrupt, SnapshotMeta, SnapshotNotFound, SnapshotStore


class FakeAgent:
    """One node's agent, as records. `fail[method]` makes the next call of that method raise;
    `commit_then_fail` makes a checkpoint commit its snapshot and then lose the reply."""

    def __init__(self, node: str, snapshots: SnapshotStore, logs: dict[str, bytes] | None = None) -> None:
        self.node = node
        self.snapshots = snapshots
        self.sandboxes: dict[str, SandboxView] = {}
        self.specs: dict[str, EpisodeSpec] = {}
        self.env: dict[str, dict[str, str]] = {}
        self.fail: dict[str, StasisError] = {}
        self.commit_then_fail: StasisError | None = None
        self.corrupt: set[str] = set()
        self.registry: dict[str, str] = {}
        self.pulled: list[str] = []
        self.logs: dict[str, bytes] = logs if logs is not None else {}
        """Harness logs by sandbox or snapshot id (shared by the nodes, as a snapshot store is)."""
        self.calls: list[tuple[str, str]] = []
        self.reports_digest = True
        """False: an agent from before manifests were digested, whose replies carry none."""
        self.restored: list[tuple[str, str]] = []
        self.identities: dict[str, RestoreIdentity] = {}
        """Who each restored sandbox was asked to be, by sandbox id."""
        """(snapshot id, manifest digest) of each restore asked of this node."""
        self.clock_skew_s = 0.0
        """How far this node's clock is ahead of the orchestrator's."""
        self.verifier_logs: dict[str, bytes] = {}
        """What the verifier prints for an episode, by episode id (shared by the nodes); "1.0"
        for any other."""
        self.hold: dict[str, threading.Event] = {}
        """A method named here waits (up to 10 s) for its event to be set before it runs."""
        self._lock = threading.Lock()

    def _enter(self, method: str, sandbox_id: str) -> None:
        if (gate := self.hold.get(method)) is not None:
            gate.wait(10)
        with self._lock:
            self.calls.append((method, sandbox_id))
            exc = self.fail.pop(method, None)
        if exc is not None:
            raise exc

    def resolve_image(self, reference: str) -> str:
        """A registry of the test's making: `registry` maps each tag it knows to a digest."""
        self._enter("resolve_image", reference)
        if reference not in self.registry:
            raise SpecRefused(self.node, f"image {reference!r}: manifest unknown")
        return reference.rsplit(":", 1)[0] + "@" + self.registry[reference]

    def pull_image(
        self, reference: str, name: str, progress: Callable[[PullStatus], None] | None = None
    ) -> ImageView:
        self._enter("pull_image", reference)
        for done in (0, 4096) if progress else ():
            progress(PullStatus(self.node, "fetching", done, 4096))  # type: ignore[misc]
        self.pulled.append(reference)
        return ImageView(digest="sha256:" + "c" * 64, names=[name, reference], size_bytes=4096)

    def create(
        self, sandbox_id: str, spec: EpisodeSpec, *, address: str, hostname: str, env: dict[str, str]
    ) -> SandboxView:
        self._enter("create", sandbox_id)
        view = SandboxView(sandbox_id, self.node, SandboxState.RUNNING, None, False)
        self.sandboxes[sandbox_id], self.specs[sandbox_id], self.env[sandbox_id] = view, spec, env
        return view

    def checkpoint(
        self, sandbox_id: str, snapshot: SnapshotTarget, *, leave_running: bool
    ) -> CheckpointOutcome:
        self._enter("checkpoint", sandbox_id)
        if sandbox_id not in self.sandboxes:
            raise NotFound(f"sandbox {sandbox_id} is not on node {self.node}")
        with tempfile.TemporaryDirectory(prefix="fake-checkpoint-") as tmp:
            (Path(tmp) / "pages.img").write_bytes(f"memory of {sandbox_id}".encode() * 100)
            manifest = self.snapshots.put(
                tmp,
                SnapshotMeta(
                    snapshot_id=snapshot.snapshot_id,
                    episode_id=snapshot.episode_id,
                    seq=snapshot.sequence,
                    parent_id=snapshot.parent_id or None,
                    node=self.node,
                    reason=snapshot.reason,
                    created_at=datetime.fromtimestamp(time.time() + self.clock_skew_s, UTC),
                    image_digest="sha256:" + "0" * 64,
                    runtime_backend="runc",
                    criu_version="4.2.1",
                    trajectory_cursor=snapshot.trajectory_cursor,
                    timings_ms={"dump_ms": 12.5},
                ),
            )
        self.logs[snapshot.snapshot_id] = self.logs.get(sandbox_id, b"")
        if not leave_running:
            del self.sandboxes[sandbox_id]
        if self.commit_then_fail is not None:
            exc, self.commit_then_fail = self.commit_then_fail, None
            raise exc
        return CheckpointOutcome(
            snapshot_id=manifest.snapshot_id,
            created_at=manifest.created_at.timestamp(),
            logical_bytes=manifest.sizes.logical_bytes,
            stored_bytes=manifest.sizes.stored_bytes,
            new_bytes=manifest.sizes.new_bytes,
            timings_ms={"dump_ms": 12.5, "put_ms": 3.0},
            since_freeze_ms=(time.time() + self.clock_skew_s - manifest.created_at.timestamp()) * 1000,
            manifest_digest=manifest.digest if self.reports_digest else "",
        )

    def restore(
        self, sandbox_id: str, snapshot_id: str, manifest_digest: str, image: str, identity: RestoreIdentity
    ) -> SandboxView:
        """Reads the snapshot's manifest from the real store as a node does: checked against the
        recorded digest first (`SnapshotStore.manifest`)."""
        self._enter("restore", sandbox_id)
        self.restored.append((snapshot_id, manifest_digest))
        self.identities[sandbox_id] = identity
        if snapshot_id in self.corrupt:
            raise SnapshotDamaged(self.node, f"snapshot {snapshot_id!r}: chunk does not match its hash")
        try:
            self.snapshots.manifest(snapshot_id, manifest_digest)
        except SnapshotNotFound:
            raise NotFound(f"snapshot {snapshot_id!r} not found") from None
        except SnapshotCorrupt as exc:
            raise SnapshotDamaged(self.node, str(exc)) from None
        self.logs[sandbox_id] = self.logs.get(snapshot_id, b"")
        view = SandboxView(
            sandbox_id, self.node, SandboxState.RUNNING, None, False, restored_from=snapshot_id,
            timings_ms={"fetch_ms": 4.0, "restore_ms": 6.0}, log_start=len(self.logs[sandbox_id]),
        )  # fmt: skip
        self.sandboxes[sandbox_id] = view
        return view

    def get(self, sandbox_id: str) -> SandboxView | None:
        self._enter("get", sandbox_id)
        return self.sandboxes.get(sandbox_id)

    def delete(self, sandbox_id: str) -> None:
        self._enter("delete", sandbox_id)
        self.sandboxes.pop(sandbox_id, None)

    def run_verifier(
        self, sandbox_id: str, command: tuple[str, ...], files: dict[str, bytes], image: str, timeout_s: float
    ) -> VerifierResult:
        self._enter("run_verifier", sandbox_id)
        name = ids.SandboxId.parse(sandbox_id)
        log = self.verifier_logs.get(name.episode_id if name else "", b"1.0\n")
        return VerifierResult(exit_code=0, timed_out=False, log=log, duration_ms=1.0)

    def harness_log(
        self,
        sandbox_id: str = "",
        *,
        snapshot_id: str = "",
        offset: int | None = None,
        tail_bytes: int = 65536,
    ) -> tuple[bytes, int]:
        self._enter("harness_log", sandbox_id or snapshot_id)
        log = self.logs.get(sandbox_id or snapshot_id, b"")
        return (log[offset:] if offset is not None else log[-tail_bytes:]), len(log)

    def exit(self, sandbox_id: str, code: int) -> None:
        """The harness in a sandbox exits."""
        self.sandboxes[sandbox_id] = replace(
            self.sandboxes[sandbox_id], state=SandboxState.EXITED, exit_code=code
        )

    def views(self) -> list[SandboxView]:
        return list(self.sandboxes.values())


class FakeAgents:
    """The registered nodes' fake agents, by name (the `NodeAgents` protocol)."""

    def __init__(self, snapshots: SnapshotStore) -> None:
        self.snapshots = snapshots
        self.agents: dict[str, FakeAgent] = {}
        self.logs: dict[str, bytes] = {}
        self.verifier_logs: dict[str, bytes] = {}

    def set(self, node: str, address: str) -> None:
        agent = self.agents.setdefault(node, FakeAgent(node, self.snapshots, self.logs))
        agent.verifier_logs = self.verifier_logs

    def get(self, node: str) -> FakeAgent:
        if node not in self.agents:
            raise AgentUnavailable(f"node {node} has not registered", delay=2)
        return self.agents[node]

    def close(self) -> None:
        pass
