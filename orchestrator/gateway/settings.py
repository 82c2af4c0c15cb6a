"""Settings of the inference gateway, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

GATEWAY_IP = "169.254.1.1"
"""Every node serves the gateway at this address, so a sandbox finds it on any node."""


@dataclass(frozen=True)
class GatewaySettings:
    listen: str = ""
    """Where the gateway listens; empty means no gateway (sandboxes get no model endpoint)."""
    port: int = 8080
    """Port of the gateway as sandboxes see it, on 169.254.1.1."""
    upstream: str = ""
    """OpenAI-compatible model server the gateway forwards to, up to and including /v1."""
    upstream_api_key: str = ""
    """Bearer token for the upstream, if it wants one; sandboxes never see it."""

    @property
    def base_url(self) -> str:
        """The model endpoint as a sandbox sees it."""
        return f"http://{GATEWAY_IP}:{self.port}/v1"
