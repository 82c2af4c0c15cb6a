"""The inference gateway: it records every model turn in the trajectory (`orchestrator.trajectory`).

Owns the harness's only model endpoint (`server` wires it: `routes`, `authentication`,
`answering`, `relay`, `recording`, `delivery`, `commit`), every protocol it speaks (`protocols/`:
OpenAI Chat Completions, Completions and Responses, Anthropic Messages), prompts as token ids
through the model's chat template (`rendering`, `prompts`) and the upstreams' token routes
(`dialects`).
Imports the trajectory room, the state room's databases and the domain; never the control loop
or the API.
"""

from orchestrator.gateway.authentication import Peer, live_peer
from orchestrator.gateway.protocols import GatewayError
from orchestrator.gateway.rendering import ChatRenderer, RendererUnavailable
from orchestrator.gateway.routes import PROTOCOLS
from orchestrator.gateway.server import Gateway
from orchestrator.gateway.settings import GATEWAY_IP, GatewaySettings
from orchestrator.gateway.upstream import Upstream

__all__ = [
    "GATEWAY_IP",
    "PROTOCOLS",
    "ChatRenderer",
    "Gateway",
    "GatewayError",
    "GatewaySettings",
    "Peer",
    "RendererUnavailable",
    "Upstream",
    "live_peer",
]
