"""Errors of the node agent. Each family maps to one gRPC status code in `service`."""

from __future__ import annotations

from collections.abc import Sequence


class AgentError(Exception):
    """Root of every error the node agent raises on purpose."""


class InvalidSpec(AgentError):
    """A request field is malformed. Names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(AgentError):
    """An image, sandbox or checkpoint that the request names does not exist here."""


class AlreadyExists(AgentError):
    """The sandbox id is taken on this node."""


class FailedPrecondition(AgentError):
    """The request is well formed but the node's state refuses it."""


class NoRoom(AgentError):
    """The node cannot hold what is asked now (its disk for sandboxes): another node may."""


class Busy(AgentError):
    """Another operation on the same sandbox is in progress; retry once it is done."""


class ImageMismatch(FailedPrecondition):
    """A checkpoint was taken over another base image than the one on this node."""

    def __init__(self, checkpoint_digest: str, node_digest: str, image: str) -> None:
        super().__init__(
            f"checkpoint was taken over image digest {checkpoint_digest}, "
            f"but image {image!r} on this node has digest {node_digest}"
        )
        self.checkpoint_digest = checkpoint_digest
        self.node_digest = node_digest


class ImageRejected(FailedPrecondition):
    """An image could not be pulled or would be unsafe to unpack: names the image and the layer."""


class CheckpointCorrupt(FailedPrecondition):
    """A checkpoint directory is truncated, tampered with or not a Stasis checkpoint."""


class ToolUnavailable(AgentError):
    """A tool (runc, criu, dockerd, ...) could not be run at all: an internal error."""


class CommandFailed(AgentError):
    """A tool ran and refused: carries argv, exit code and the tail of its log."""

    def __init__(
        self,
        *,
        argv: Sequence[str],
        returncode: int,
        stderr_tail: str,
        what: str = "",
        log_tail: str = "",
        timeout_s: float | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.log_tail = log_tail
        self.timeout_s = timeout_s
        """Set when the tool was killed for running longer than this."""
        head = what or f"{self.argv[0]} failed"
        how = f"killed, timed out after {timeout_s:g} s" if timeout_s is not None else f"exit {returncode}"
        detail = log_tail or stderr_tail
        super().__init__(
            f"{head} ({how}): {' '.join(self.argv[:4])}{' ...' if len(self.argv) > 4 else ''}"
            + (f"\n{detail}" if detail else "")
        )

    def with_log(self, what: str, log_tail: str) -> CommandFailed:
        return CommandFailed(
            argv=self.argv,
            returncode=self.returncode,
            stderr_tail=self.stderr_tail,
            what=what,
            log_tail=log_tail,
            timeout_s=self.timeout_s,
        )
