"""Durable control-plane state: the `StateStore` interface, its embedded SQLite implementation
and its PostgreSQL one, plus the databases the trajectory ledger shares (SQLite's, or the
PostgreSQL store's).

Imports only the domain. Knows nothing of gRPC, nodes' agents or the gateway.
"""

from orchestrator.state.dir_lock import StateDirLock
from orchestrator.state.lease import Lease, standing_by
from orchestrator.state.postgres import PostgresStateStore
from orchestrator.state.sqlite import SqliteStateStore
from orchestrator.state.store import StateStore

__all__ = ["Lease", "PostgresStateStore", "SqliteStateStore", "StateDirLock", "StateStore", "standing_by"]
