"""The inference gateway and the trajectory ledger it writes.

Owns the harness's only model endpoint, every protocol it speaks (`protocols/`: OpenAI Chat
Completions, Completions and Responses, Anthropic Messages), prompts as token ids through the
model's chat template (`rendering`, `prompts`) and the upstreams' token routes (`dialects`),
the canonical form of model requests, the turn tree of every episode and its training samples. Imports the domain and the state room's databases
(SQLite's, or the PostgreSQL store's); never the control loop or the API.
"""

from orchestrator.gateway.canonical import CanonicalRequest
from orchestrator.gateway.ledger import Branch, Ledger, Lineage, Sampling, Turn, Verification
from orchestrator.gateway.protocols import GatewayError
from orchestrator.gateway.rendering import ChatRenderer, RendererUnavailable
from orchestrator.gateway.samples import Sample, samples
from orchestrator.gateway.server import PROTOCOLS, Gateway, Peer, live_peer
from orchestrator.gateway.settings import GATEWAY_IP, GatewaySettings
from orchestrator.gateway.upstream import Upstream

__all__ = [
    "GATEWAY_IP",
    "PROTOCOLS",
    "Branch",
    "CanonicalRequest",
    "ChatRenderer",
    "Gateway",
    "GatewayError",
    "GatewaySettings",
    "Ledger",
    "Lineage",
    "Peer",
    "RendererUnavailable",
    "Sample",
    "Sampling",
    "Turn",
    "Upstream",
    "Verification",
    "live_peer",
    "samples",
]
