"""What the gateway writes to the ledger of a sampled turn: the turn itself, committed with the
next group commit, and the model server's failures against the run they struck (`Outages`).

A turn is placed by the episode's run as it stands when the turn commits (`live_run`), not when
its sampling began; one that outlives its episode is refused (409) and nothing is recorded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

from orchestrator.domain import Conflict, Episode
from orchestrator.gateway.commit import GroupCommit
from orchestrator.gateway.generation import Generation
from orchestrator.gateway.metrics import Metrics
from orchestrator.gateway.protocols import GatewayError
from orchestrator.gateway.settings import GatewaySettings
from orchestrator.gateway.turn import Turn
from orchestrator.state.sql import Connection
from orchestrator.trajectory import edges
from orchestrator.trajectory.ledger import Ledger
from orchestrator.trajectory.turns import Turn as RecordedTurn
from orchestrator.trajectory.turns import extension

log = logging.getLogger(__name__)

UNVERSIONED_WARNED = 4096
"""Episodes remembered as warned of a turn with no policy version, so each is warned once; the
longest-ago go first."""


class Recorder:
    """Records the gateway's sampled turns and the upstream failures of their runs."""

    def __init__(
        self,
        settings: GatewaySettings,
        ledger: Ledger,
        commit: GroupCommit,
        metrics: Metrics,
        live_run: Callable[[Connection, str], tuple[int, str]] | None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.commit = commit
        self.metrics = metrics
        self.live_run = live_run
        """An episode's current run, and why its trajectory takes no more turns, read again in
        the transaction that records a turn (`Ledger.record`): a generation that outlives its run
        is placed by what holds when it commits, and one that outlives its episode is refused."""
        self._unversioned: OrderedDict[str, None] = OrderedDict()
        """Episodes warned of a turn recorded with no policy version."""

    async def record(
        self, turn: Turn, g: Generation, response: bytes, delivered: bytes, upstream_ms: float, sending: bool
    ) -> RecordedTurn:
        e, req = turn.episode, turn.request
        lineage = (
            turn.prompt.lineage if turn.prompt is not None else extension(turn.parent, g.prompt_token_ids)
        )
        live_run = self.live_run
        try:
            recorded = await self.commit.run(
                lambda: self.ledger.record(
                    e.id, e.runs, turn.resumed_at, req.canonical, turn.raw, g.answer(), response,
                    turn.protocol.name, delivered, g.token_ids, g.logprobs, g.prompt_token_ids, g.policy_version,
                    upstream_ms, lineage=lineage, mode=g.mode, finish_reason=g.finish_reason, sampling=turn.sampling,
                    logprobs_mode=turn.logprobs_mode, tools_key=req.canonical.tools_key,
                    live_run=(lambda db: live_run(db, e.id)) if live_run is not None else None,
                    sending=sending, spawns=edges.spawns([c.arguments for c in g.tool_calls]),
                )
            )  # fmt: skip
        except Conflict as exc:
            raise GatewayError(409, f"{exc}; nothing is recorded", "conflict_error") from None
        self.metrics.turn(recorded)
        if not recorded.policy_version:
            self._warn_unversioned(e.id)
        return recorded

    async def outage(self, e: Episode, why: str) -> None:
        """Note that the model server failed a request of the episode's run (`Outages`)."""
        self.metrics.count("upstream_failures")
        try:
            await self.commit.run(lambda: self.ledger.outages.failed(e.id, e.runs, why))
        except Exception:  # the harness still hears of the failure
            log.exception("could not note the upstream failure of %s", e.id)

    def _warn_unversioned(self, episode_id: str) -> None:
        """Say, once per episode, that a turn was recorded with no policy version."""
        if episode_id in self._unversioned:
            return
        self._unversioned[episode_id] = None
        if len(self._unversioned) > UNVERSIONED_WARNED:
            self._unversioned.popitem(last=False)
        log.warning(
            "episode %s: a turn was recorded with no policy version: the model server sent no %s header "
            "and no version is published (PublishPolicy, `stasis policy publish N`); its tokens have no "
            "staleness (further such turns of this episode are counted in "
            "stasis_gateway_policy_version_unknown_total, not logged)",
            episode_id, self.settings.policy_version_header,
        )  # fmt: skip
