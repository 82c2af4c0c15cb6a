"""Durable control-plane state, one aggregate per module: episodes, groups, snapshots, events,
nodes, images, logs and request ids. `StateStore` composes them; `SqliteStateStore` keeps them
in an embedded SQLite file, `PostgresStateStore` in a PostgreSQL database. The trajectory ledger
keeps its tables in the same database (SQLite's file, or the PostgreSQL store's `database`).

Imports only the domain. Knows nothing of gRPC, nodes' agents or the gateway.
"""

from orchestrator.state.dir_lock import StateDirLock
from orchestrator.state.episode_rows import live_run
from orchestrator.state.lease import Lease, standing_by
from orchestrator.state.postgres import PostgresStateStore
from orchestrator.state.sqlite import SqliteStateStore
from orchestrator.state.store import StateStore

__all__ = [
    "Lease",
    "PostgresStateStore",
    "SqliteStateStore",
    "StateDirLock",
    "StateStore",
    "live_run",
    "standing_by",
]
