"""One node's sandboxes: `Node` creates, checkpoints, restores, grades, kills and removes them,
with nothing left behind; the service calls it from many threads.

Beside it: the sandboxes' records and directories and which an operation holds (`sandboxes`),
where a restore stages what it fetches (`staging`), the harness's log (`logs`), and the runtime
the settings choose (`backends`).

Owns every operation's order of steps and what undoes each. Imports the runtimes, CRIU, images,
the host room and the agent's records; never the server.
"""

from sandbox_agent.node.node import Node, SnapshotTarget, VerifierResult

__all__ = ["Node", "SnapshotTarget", "VerifierResult"]
