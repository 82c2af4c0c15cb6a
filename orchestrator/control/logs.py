"""`stasis logs`: a harness's output across all its runs.

The log lives inside the sandbox's writable layer, so every snapshot carries it and each
restored run appends to what earlier runs wrote. It is read from wherever it is now: the live
sandbox, else the log kept when the episode finished, else the episode's last snapshot (read by
any ready node). `Episode.log_offsets` marks where each run's output begins.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.control.node_agent import NodeAgents
from orchestrator.domain import (
    Episode,
    EpisodeState,
    FailedPrecondition,
    InvalidArgument,
    NodeState,
    NotFound,
    StasisError,
)
from orchestrator.state import StateStore

LIVE = (EpisodeState.RUNNING, EpisodeState.CHECKPOINTING)


@dataclass(frozen=True)
class LogPage:
    content: bytes
    next_offset: int
    """Ask again from here (an offset within the run, or within the whole log for run 0)."""
    complete: bool
    """Nothing more will come: the run, or the episode, has ended and all of it was returned."""


class Logs:
    def __init__(self, store: StateStore, agents: NodeAgents) -> None:
        self.store = store
        self.agents = agents

    def page(self, episode_id: str, run: int = 0, offset: int = 0) -> LogPage:
        """Output from `offset` on: of run `run`, or of every run when 0."""
        e = self.store.episodes.get(episode_id)
        if offset < 0:
            raise InvalidArgument("offset", f"{offset} must be >= 0")
        if not 0 <= run <= e.runs:
            raise InvalidArgument(
                "run", f"episode {e.id} has had {e.runs} run(s); ask for 1 to {e.runs}, or 0 for all"
            )
        start, end = 0, None
        if run:
            if run > len(e.log_offsets):
                return LogPage(b"", offset, e.state.terminal)  # not started (yet, or ever)
            start = e.log_offsets[run - 1]
            if start < 0:
                raise FailedPrecondition(
                    f"the output of run {run} of {e.id} is gone: a later run started over"
                )
            end = e.log_offsets[run] if run < len(e.log_offsets) else None
        position = start + offset
        content, size, live = self._read(e, position)
        if end is not None:
            content = content[: max(0, end - position)]
        done = position + len(content)
        complete = (end is not None and done >= end) or (not live and e.state.terminal and done >= size)
        return LogPage(content, offset + len(content), complete)

    def _read(self, e: Episode, position: int) -> tuple[bytes, int, bool]:
        """Bytes of the whole log from `position`, the log's size, and whether it is still growing."""
        if e.state in LIVE and e.node and e.sandbox_id:
            try:
                content, size = self.agents.get(e.node).harness_log(e.sandbox_id, offset=position)
                return content, size, True
            except (StasisError, NotFound):
                pass  # moved on meanwhile: read what it left
        kept = self.store.logs.get(e.id)
        if kept is not None:
            first, content = kept
            return content[max(0, position - first) :], first + len(content), False
        if e.last_snapshot_id:
            for node in self.store.nodes.all():
                if node.state != NodeState.READY:
                    continue
                try:
                    content, size = self.agents.get(node.name).harness_log(
                        snapshot_id=e.last_snapshot_id, offset=position
                    )
                    return content, size, False
                except StasisError:
                    continue
        return b"", 0, False
