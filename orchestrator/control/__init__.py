"""The control loop and everything it drives: scheduling policy, node membership and fencing,
operations on node agents, settling after crashes, user commands, snapshot retention, the
verifier's finish step and the Kubernetes node watcher.

Owns every decision about where an episode runs and when it moves. Talks to nodes only through
the `NodeAgent` protocol (`node_agent`). Imports the gateway's ledger, the state store and the
domain; never the API, the client or the CLI. Only `kube` may import the Kubernetes client.
"""

from orchestrator.control.loop import Control
from orchestrator.control.node_agent import (
    AgentPool,
    AgentRefused,
    AgentUnavailable,
    CheckpointOutcome,
    ForkMark,
    ImageView,
    NodeAgent,
    NodeAgents,
    RestoreIdentity,
    SandboxState,
    SandboxView,
    SnapshotDamaged,
    SnapshotTarget,
    SpecRefused,
    VerifierResult,
)
from orchestrator.control.operations import default_finish
from orchestrator.control.settings import ControlSettings
from orchestrator.control.verifier import Verifier, parse_reward

__all__ = [
    "AgentPool",
    "AgentRefused",
    "AgentUnavailable",
    "CheckpointOutcome",
    "Control",
    "ControlSettings",
    "ForkMark",
    "ImageView",
    "NodeAgent",
    "NodeAgents",
    "RestoreIdentity",
    "SandboxState",
    "SandboxView",
    "SnapshotDamaged",
    "SnapshotTarget",
    "SpecRefused",
    "Verifier",
    "VerifierResult",
    "default_finish",
    "parse_reward",
]
