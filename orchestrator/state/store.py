"""What the control plane needs from its database, one aggregate at a time: `store.episodes`,
`store.groups`, `store.snapshots`, `store.events`, `store.nodes`, `store.images`, `store.logs`
and `store.requests`. `SqliteStateStore` keeps them in an embedded file; `PostgresStateStore`
on a database server. Both compose the same aggregates (`SqlStateStore`) over their database.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.state.episodes import Episodes, SqlEpisodes
from orchestrator.state.events import Events, SqlEvents, WaitFor
from orchestrator.state.groups import Groups, SqlGroups
from orchestrator.state.images import Images, SqlImages
from orchestrator.state.lease import Lease
from orchestrator.state.logs import Logs, SqlLogs
from orchestrator.state.nodes import Nodes, SqlNodes
from orchestrator.state.requests import Requests, SqlRequests
from orchestrator.state.snapshots import Snapshots, SqlSnapshots
from orchestrator.state.sql import Sql


class StateStore(Protocol):
    """The control plane's state, by aggregate; a server database can stand in for SQLite."""

    @property
    def episodes(self) -> Episodes: ...
    @property
    def groups(self) -> Groups: ...
    @property
    def snapshots(self) -> Snapshots: ...
    @property
    def events(self) -> Events: ...
    @property
    def nodes(self) -> Nodes: ...
    @property
    def images(self) -> Images: ...
    @property
    def logs(self) -> Logs: ...
    @property
    def requests(self) -> Requests: ...

    def lease(self, holder: str) -> Lease:
        """Leadership among the orchestrators sharing this store (`state.lease`). Once taken
        out, the store writes only while `holder` leads."""

    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...


class SqlStateStore:
    """Every aggregate over one SQL database; a subclass opens the database and names its lease."""

    def __init__(self, sql: Sql, wait_for: WaitFor) -> None:
        self.episodes = SqlEpisodes(sql)
        self.groups = SqlGroups(sql)
        self.snapshots = SqlSnapshots(sql)
        self.events = SqlEvents(sql, wait_for)
        self.nodes = SqlNodes(sql)
        self.images = SqlImages(sql)
        self.logs = SqlLogs(sql)
        self.requests = SqlRequests(sql)
