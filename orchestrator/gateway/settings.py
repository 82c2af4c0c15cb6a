"""Settings of the inference gateway, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protos.shared.tls import TlsFiles

GATEWAY_IP = "169.254.1.1"
"""Every node serves the gateway at this address, so a sandbox finds it on any node."""


@dataclass(frozen=True)
class GatewaySettings:
    listen: str = ""
    """Where the gateway listens; empty means no gateway (sandboxes get no model endpoint)."""
    port: int = 8080
    """Port of the gateway as sandboxes see it, on 169.254.1.1."""
    tls: TlsFiles | None = None
    """The orchestrator's certificate from the cluster CA, where nodes relay the gateway to their
    sandboxes: `listen` then speaks TLS and completes a handshake only with a certificate from
    that CA, and a node's certificate speaks only for the episodes placed on it (`live_peer`).
    None: plaintext, for sandboxes that reach the gateway on their own host (`stasis up`) or a
    cluster run `--insecure`."""
    upstream: str = ""
    """OpenAI-compatible model server the gateway forwards to, up to and including /v1."""
    upstream_api_key: str = ""
    """Bearer token for the upstream, if it wants one; sandboxes never see it."""
    renderer: str = ""
    """The model's chat template as `renderers` names it (qwen3, qwen3.5, glm-4.5, kimi-k2,
    deepseek-v3, llama-3, ...): the gateway then builds every prompt as token ids, sends ids
    upstream and parses the sampled ids back (token-in-token-out). Empty: text mode, where the
    upstream renders the messages itself and drift is only detected."""
    tokenizer: str = ""
    """The model's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`), read locally;
    needed with `renderer`."""
    renderer_options: tuple[tuple[str, Any], ...] = ()
    """The renderer's settings (e.g. enable_thinking); its `thinking_retention` defaults to
    "all", so earlier reasoning stays in later prompts and they keep extending."""
    upstream_api: str = "vllm"
    """How the upstream takes token ids: vllm (/v1/completions with a token-id prompt) or sglang
    (/generate with input_ids)."""
    policy_version_header: str = "x-policy-version"
    """Response header in which the upstream names the policy (weights) version that sampled.
    Without it a turn records the version a trainer published when its sampling began."""
    max_body_bytes: int = 32 << 20
    """Largest request body. A long agent conversation is a few MB of JSON; more is a bug or an
    attack, refused (413) before it is read."""
    max_concurrent_turns: int = 256
    """Generations in flight upstream at once; later requests wait their turn, served by episode
    in turn (`slots.py`). Well above the slots a cluster's nodes offer, well below what exhausts
    the orchestrator's file descriptors."""
    max_turns_per_episode: int = 16
    """Generations of one episode in flight at once: an agent's parallel calls and subagents
    fit; a harness that sends hundreds waits behind itself, not in front of its neighbours."""
    turn_wait_s: float = 300.0
    """Longest a request waits for a generation slot before it is refused (429)."""
    max_connections: int = 4096
    """Connections the gateway holds open at once; one more is answered 503 and closed. Well
    below the orchestrator's file descriptors, well above what a cluster's sandboxes keep open."""
    max_connections_per_peer: int = 256
    """Connections one peer may hold open: a sandbox, or a node that relays for its sandboxes.
    A harness keeps a few; one that opens them without end takes no one else's."""
    upstream_connections: int = 256
    """Size of the pooled keep-alive connections to the upstream."""
    temperature: float = 1.0
    """Temperature asked for when a harness names none: the gateway always names one, so the
    record says what its tokens were drawn with (a model server's own default, from a model's
    generation config, is not known here)."""
    top_p: float = 1.0
    """Top-p asked for when a harness names none, for the same reason."""
    max_tokens: int = 16384
    """Token mode: the limit on sampled tokens when a harness names none. A token-level route
    has no chat route's default (vLLM's /v1/completions stops at 16), and this is far above what
    one turn of an agent writes."""
    metrics_listen: str = ""
    """Where /metrics (Prometheus's text format) is served, apart from the sandboxes' port;
    empty: nowhere."""
    upstream_timeout_s: float = 600.0
    """Longest silence from the upstream while a generation is under way."""
    harness_timeout_s: float = 120.0
    """Longest a harness may take to send its request's body, or to take in each part of an
    answer. One that stops reading is cut off (its retry is a replay), so that it cannot hold a
    generation's slot. Well above the longest freeze of a checkpoint that leaves it running."""

    def __post_init__(self) -> None:
        if self.upstream_api not in ("vllm", "sglang"):
            raise ValueError(f"upstream_api: {self.upstream_api!r} is not vllm or sglang")
        if self.renderer and not self.tokenizer:
            raise ValueError(f"tokenizer: renderer {self.renderer!r} needs the model's tokenizer directory")

    @property
    def base_url(self) -> str:
        """The OpenAI endpoint as a sandbox sees it."""
        return f"http://{GATEWAY_IP}:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """The Anthropic endpoint as a sandbox sees it (Anthropic clients add /v1 themselves)."""
        return f"http://{GATEWAY_IP}:{self.port}"
