"""The inference gateway and the trajectory ledger it writes.

Owns the harness's only model endpoint, the canonical form of model requests, and the turn tree
of every episode. Imports the domain and the state room's SQLite connection; never the control
loop or the API.
"""

from orchestrator.gateway.canonical import CanonicalRequest
from orchestrator.gateway.ledger import Branch, Ledger, Turn, Verification
from orchestrator.gateway.server import Gateway, GatewayError, Upstream
from orchestrator.gateway.settings import GATEWAY_IP, GatewaySettings

__all__ = [
    "GATEWAY_IP",
    "Branch",
    "CanonicalRequest",
    "Gateway",
    "GatewayError",
    "GatewaySettings",
    "Ledger",
    "Turn",
    "Upstream",
    "Verification",
]
