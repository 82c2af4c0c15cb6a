"""Help as kubectl writes it: a summary, what else there is to know, every option with its units
and default, and examples that parse (tests/orchestrator/test_cli_help.py holds every command to it)."""

from __future__ import annotations

import argparse
import textwrap
from typing import TypeAlias

EP = "ep-3f9a1c07d2"
"""The episode id the examples use."""

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What `add_subparsers` returns, which a module adds its commands to."""


def examples(*examples: tuple[str, str]) -> str:
    """A help's closing section, as kubectl writes it: a comment, then a command that parses."""
    return "Examples:\n" + "\n\n".join(f"  # {what}\n  {line}" for what, line in examples)


def command(
    sub: Subparsers,
    name: str,
    summary: str,
    *cases: tuple[str, str],
    about: str = "",
) -> argparse.ArgumentParser:
    """A subcommand: its summary in the list of commands; in its own --help the summary, what else
    there is to know, and examples (each one parses: tests/orchestrator/test_cli_help.py)."""
    text = summary[0].upper() + summary[1:] + "."
    return sub.add_parser(
        name,
        help=summary,
        description="\n\n".join(textwrap.fill(t, 90, break_on_hyphens=False) for t in (text, about) if t),
        epilog=examples(*cases),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def output(p: argparse.ArgumentParser, *choices: str) -> None:
    """The -o of a command that prints records: a table, or JSON or YAML for programs."""
    p.add_argument(
        "-o",
        "--output",
        choices=choices or ("table", "json", "yaml"),
        default="table",
        help="output format: %(choices)s (default %(default)s)",
    )
