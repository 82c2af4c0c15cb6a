"""Durable control-plane state: the `StateStore` interface and its embedded SQLite
implementation, plus the SQLite connection the trajectory ledger shares.

Imports only the domain. Knows nothing of gRPC, nodes' agents or the gateway.
"""

from orchestrator.state.sqlite import SqliteStateStore
from orchestrator.state.store import StateStore

__all__ = ["SqliteStateStore", "StateStore"]
