"""`python -m orchestrator.cli`: the `stasis` command."""

from orchestrator.cli import entry

entry()
