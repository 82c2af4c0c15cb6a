"""What the control plane needs from its database. `SqliteStateStore` is the embedded one;
`PostgresStateStore` keeps the same state on a database server."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    Event,
    Group,
    ImageRecord,
    NodeRecord,
    NodeState,
    SnapshotRecord,
)
from orchestrator.state.lease import Lease


class StateStore(Protocol):
    """What the control plane needs from its database; a server database can stand in for SQLite."""

    def submit(self, spec: EpisodeSpec, request_id: str, address_pool: ipaddress.IPv4Network) -> Episode: ...
    def submit_many(
        self,
        submits: Sequence[tuple[EpisodeSpec, str]],
        address_pool: ipaddress.IPv4Network,
        group: Group | None = None,
    ) -> list[Episode]:
        """All of them, durably, or none; with `group`, they are its members in index order."""

    def group(self, group_id: str) -> Group: ...
    def groups(self) -> list[Group]: ...
    def members(self, group_id: str) -> list[Episode]: ...

    def get(self, episode_id: str) -> Episode: ...
    def by_token(self, token: str) -> Episode | None: ...
    def query(
        self,
        states: Collection[EpisodeState] = (),
        node: str = "",
        labels: Mapping[str, str] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 0,
    ) -> list[Episode]:
        """Episodes in submission order: in one of `states`, on `node`, past `after` (an episode's
        submitted_at and id). `limit` bounds the rows read, before `labels` (all of which an
        episode must carry) are matched."""

    def ended_before(self, moment: float) -> list[str]: ...
    def snapshot_anchors(self) -> tuple[dict[str, str], list[str]]: ...
    def on_nodes(self, node: str = "") -> list[Episode]: ...
    def queue(self, now: float, page: int = 256) -> Iterator[Episode]: ...
    def transition(
        self,
        episode_id: str,
        to: EpisodeState,
        reason: str,
        *,
        expect: Collection[EpisodeState] = (),
        snapshot: SnapshotRecord | None = None,
        **changes: Any,
    ) -> Episode: ...
    def update(
        self, episode_id: str, *, decision: str = "", expect: Collection[EpisodeState] = (), **changes: Any
    ) -> Episode: ...
    def add_snapshot(self, snapshot: SnapshotRecord, **changes: Any) -> Episode: ...
    def events(
        self, since_seq: int = 0, episode_ids: Collection[str] = (), limit: int = 1000
    ) -> list[Event]: ...
    def wait_for_events(self, since_seq: int, timeout: float) -> bool: ...
    def snapshots(self, episode_id: str) -> list[SnapshotRecord]: ...
    def upsert_node(self, node: NodeRecord) -> NodeRecord: ...
    def nodes(self) -> list[NodeRecord]: ...
    def node(self, name: str) -> NodeRecord: ...
    def set_node_state(self, name: str, state: NodeState, reason: str) -> NodeRecord: ...
    def known_request(self, request_id: str, method: str, payload: Mapping[str, Any]) -> str | None: ...
    def remember_request(
        self, request_id: str, method: str, payload: Mapping[str, Any], target: str
    ) -> None: ...
    def update_node_images(self, name: str, images: dict[str, list[str]]) -> None: ...
    def put_log(self, episode_id: str, start: int, content: bytes) -> None:
        """Keep a finished episode's harness log: `content` begins at byte `start` of it."""

    def log(self, episode_id: str) -> tuple[int, bytes] | None: ...
    def put_image(self, image: ImageRecord) -> None: ...
    def images(self) -> list[ImageRecord]: ...
    def image(self, name: str) -> ImageRecord | None: ...
    def delete_image(self, name: str) -> ImageRecord:
        """Remove a catalogue entry; NotFound if there is none."""

    def lease(self, holder: str) -> Lease:
        """Leadership among the orchestrators sharing this store (`state.lease`). Once taken
        out, the store writes only while `holder` leads."""

    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
