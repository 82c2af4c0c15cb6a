"""One node's sandboxes: `Node`, a thin facade the service calls from many threads, over one
module per operation, each reading top to bottom: `create`, `checkpoint`, `restore` (with the
lazy restore's memory still arriving), `remove` and `verify`; and `startup` (what a crashed
agent left). The operations share one `NodeContext`.

Beside them: who a restored sandbox is, a fork child's own address, host name and files
(`identity`); the sandboxes' records and directories and which an operation holds (`sandboxes`),
the disk they may use (`disk`), where a restore stages what it fetches (`staging`), the
harness's log (`logs`), and the runtime the settings choose (`backends`).

Owns every operation's order of steps and what undoes each. Imports the runtimes, CRIU, images,
the host room and the agent's records; never the server.
"""

from sandbox_agent.node.checkpoint import SnapshotTarget
from sandbox_agent.node.identity import ForkMark, Identity
from sandbox_agent.node.node import Node
from sandbox_agent.node.verify import VerifierResult

__all__ = ["ForkMark", "Identity", "Node", "SnapshotTarget", "VerifierResult"]
