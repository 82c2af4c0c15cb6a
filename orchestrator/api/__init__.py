"""The orchestrator's gRPC face and its process wiring: the public Stasis service, the node
registry, the error-to-status table, `Orchestrator`, which starts it all, and the move of its
state from SQLite to PostgreSQL (`migration`).

Owns the API boundary: specs are validated here, once. Imports the control loop, the gateway,
the state store and the domain; never the client or the CLI.
"""

from orchestrator.api.access import Tokens, add_token
from orchestrator.api.migration import migrate_to_postgres
from orchestrator.api.server import Orchestrator
from orchestrator.api.settings import AuthSettings, OrchestratorSettings

__all__ = [
    "AuthSettings",
    "Orchestrator",
    "OrchestratorSettings",
    "Tokens",
    "add_token",
    "migrate_to_postgres",
]
