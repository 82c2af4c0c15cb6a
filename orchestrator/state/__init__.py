"""Durable control-plane state: the `StateStore` interface, its embedded SQLite implementation
and its PostgreSQL one, plus the SQLite connection the trajectory ledger shares.

Imports only the domain. Knows nothing of gRPC, nodes' agents or the gateway.
"""

from orchestrator.state.postgres import PostgresStateStore
from orchestrator.state.sqlite import SqliteStateStore
from orchestrator.state.store import StateStore

__all__ = ["PostgresStateStore", "SqliteStateStore", "StateStore"]
