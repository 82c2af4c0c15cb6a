"""Every Stasis command line explains itself, as kubectl's does: each option and argument has its
help (with its default, where it has one), each command a description and examples, and each
example parses with the real parser (and the program's own checks after it)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli import parser as stasis_parser
from orchestrator.cli.commands import Subcommands
from orchestrator.reference_model import __main__ as reference_model
from sandbox_agent import __main__ as agent

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Program:
    invocations: tuple[tuple[str, ...], ...]
    """How a shell names it: an example's words up to its arguments."""
    source: str
    """The module that builds its parser."""
    parser: Callable[[], argparse.ArgumentParser]
    parse: Callable[[list[str]], object]
    """Its real parse: argparse's, then whatever the program checks before it starts."""


def _parse_args(make: Callable[[], argparse.ArgumentParser]) -> Callable[[list[str]], object]:
    return lambda argv: make().parse_args(argv)


PROGRAMS = {
    # The kubectl plugin `kubectl-stasis` is the same entry point (checked below), so one walk covers both.
    "stasis": Program(
        (("stasis",), ("kubectl", "stasis")),
        "orchestrator/cli/parser/__init__.py",
        stasis_parser,
        _parse_args(stasis_parser),
    ),
    "stasis-agent": Program(
        (("stasis-agent",),), "sandbox_agent/__main__.py", agent.parser, agent.settings_from_args
    ),
    "reference-model": Program(
        (("python", "-m", "orchestrator.reference_model"),),
        "orchestrator/reference_model/__main__.py",
        reference_model.parser,
        _parse_args(reference_model.parser),
    ),
}


def walk(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under p, p first, each with the subcommand words that reach it."""
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def selected(p: argparse.ArgumentParser, args: object) -> tuple[str, ...]:
    """The subcommand words a parse chose."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest)
            return (name, *selected(action.choices[name], args))
    return ()


def examples(p: argparse.ArgumentParser) -> list[str]:
    """The commands of a help's Examples section (its comment lines left out)."""
    _, found, section = (p.epilog or "").partition("Examples:\n")
    if not found:
        return []
    lines = [line.strip() for line in section.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _says_no_default(action: argparse.Action) -> bool:
    value = action.default
    if isinstance(value, bool) or value is None or value == argparse.SUPPRESS or value in ("", []):
        return False
    return "default" not in (action.help or "").lower()


def problems(program: Program) -> list[str]:
    """What in a program's help leaves a reader guessing, each naming its command and option."""
    found = []
    for path, p in walk(program.parser()):
        where = " ".join((program.invocations[0][-1], *path))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [f"{where} {c.dest}: no help" for c in action._choices_actions if not c.help]
                continue
            name = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                found.append(f"{where}: {name} has no help")
            elif action.option_strings and _says_no_default(action):
                found.append(f"{where}: {name} does not say its default ({action.default!r})")
        try:
            p.format_help()
        except (ValueError, TypeError, KeyError) as exc:
            found.append(f"{where}: its help does not render: {exc!r}")
        if not p.description:
            found.append(f"{where}: no description")
        if not examples(p):
            found.append(f"{where}: no examples")
        for example in examples(p):
            found += [
                f"{where}: example `{example}` {problem}"
                for problem in _example_problems(program, p, path, example)
            ]
    return found


def _example_problems(
    program: Program, top: argparse.ArgumentParser, path: tuple[str, ...], example: str
) -> list[str]:
    words = shlex.split(example)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        words.pop(0)
    invocation = next((i for i in program.invocations if tuple(words[: len(i)]) == i), None)
    if invocation is None:
        return [f"does not start with {' or '.join(' '.join(i) for i in program.invocations)}"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = program.parse(words[len(invocation) :])
    except SystemExit:
        return [f"does not parse: {err.getvalue().strip().splitlines()[-1:]}"]
    root = program.parser()
    chosen = selected(root, args) if isinstance(args, argparse.Namespace) else ()
    if chosen[: len(path)] != path:
        return [f"runs `{' '.join(chosen)}`, not this command"]
    return []


@pytest.fixture(autouse=True)
def _no_stasis_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults and checks read $STASIS_*: the examples must hold without any set."""
    for name in [n for n in os.environ if n.startswith("STASIS_")]:
        monkeypatch.delenv(name)


def test_every_command_line_of_stasis_is_walked() -> None:
    made_here = {
        str(path.relative_to(ROOT))
        for tree in ("orchestrator", "sandbox_agent")
        for path in (ROOT / tree).rglob("*.py")
        if "ArgumentParser(" in path.read_text()
    }
    assert made_here == {p.source for p in PROGRAMS.values()}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "stasis": "orchestrator.cli:entry",
        "kubectl-stasis": "orchestrator.cli:entry",
        "stasis-agent": "sandbox_agent.__main__:main",
    }


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_option_argument_and_command_explains_itself_with_examples_that_parse(name: str) -> None:
    program = PROGRAMS[name]
    assert problems(program) == []
    walked = list(walk(program.parser()))
    assert sum(len(examples(p)) for _, p in walked) >= len(walked)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("argv0", "prog"), [("/usr/bin/kubectl-stasis", "kubectl stasis"), ("stasis", "stasis")]
)
def test_usage_and_errors_name_the_program_as_it_was_typed(
    argv0: str, prog: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubectl runs its plugin `kubectl-stasis` for `kubectl stasis`: that is what the user typed."""
    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit):
        main(["preempt"])
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} preempt [-h]"), err
    assert f"\n{prog} preempt: error: the following arguments are required: ID" in err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"`{prog} COMMAND --help` explains a command" in " ".join(capsys.readouterr().out.split())
    failed = io.StringIO()
    assert main(["submit", "-f", "/nonexistent/episode.yaml", "--addr", "127.0.0.1:1"], err=failed) == 1
    assert failed.getvalue().startswith(f"{prog}: file: cannot read /nonexistent/episode.yaml"), (
        failed.getvalue()
    )


def test_every_stasis_command_has_its_method() -> None:
    commands = {path[0] for path, _ in walk(stasis_parser()) if path}
    assert {"up", "server", "preempt", "resume", "trajectories", "state"} <= commands
    assert all(callable(getattr(Subcommands, c, None)) for c in commands), commands


def test_a_bare_option_a_command_without_examples_and_a_false_example_are_each_named() -> None:
    def tiny() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(
            prog="tiny", description="d", epilog="Examples:\n  # one\n  tiny go --nope"
        )
        p.add_argument("--documented", default=3, help="with its default (default %(default)s)")
        p.add_argument("--bare")
        p.add_argument("--silent", default=5, help="a number")
        p.add_argument("--hidden", help=argparse.SUPPRESS)
        sub = p.add_subparsers(dest="command", required=True)
        go = sub.add_parser("go", help="go", description="Go.")
        go.add_argument("target", nargs="?")
        return p

    found = problems(Program((("tiny",),), "tiny.py", tiny, _parse_args(tiny)))
    assert found == [
        "tiny: --bare has no help",
        "tiny: --silent does not say its default (5)",
        "tiny: --hidden has no help",
        "tiny: example `tiny go --nope` does not parse: ['tiny: error: unrecognized arguments: --nope']",
        "tiny go: target has no help",
        "tiny go: no examples",
    ]


DOCS = ROOT / "docs" / "cli.md"
BEGIN = "<!-- generated from --help: REGENERATE_CLI_DOCS=1 pytest tests/orchestrator/test_cli_help.py -->"
END = "<!-- end of generated options -->"


def _invocation(action: argparse.Action) -> str:
    if action.nargs == 0:
        value = ""
    elif action.metavar is not None:
        value = str(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        value = action.dest.upper() if action.option_strings else action.dest
    return " ".join(part for part in (", ".join(action.option_strings), value) if part)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def reference(name: str) -> str:
    """A program's commands as docs/cli.md gives them: description, options as --help words them
    (a command's copies of the connection flags once, at the top), and examples."""
    program = PROGRAMS[name]
    out = []
    for path, p in walk(program.parser()):
        out += [f"### `{' '.join((*program.invocations[0], *path))}`", ""]
        out += ["\n\n".join(" ".join(part.split()) for part in (p.description or "").split("\n\n")), ""]
        formatter = p._get_formatter()
        rows = [
            f"| `{_invocation(a)}` | {_cell(formatter._expand_help(a))} |"
            for a in p._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
            and not (path and a.default == argparse.SUPPRESS)
        ]
        if rows:
            out += ["| option | meaning |", "|---|---|", *rows, ""]
        _, _, section = (p.epilog or "").partition("Examples:\n")
        out += ["```", *(line.strip() for line in section.splitlines()), "```", ""]
    return "\n".join(out)


def test_docs_cli_md_gives_every_option_in_the_words_of_its_help(request: pytest.FixtureRequest) -> None:
    text = DOCS.read_text()
    before, begin, rest = text.partition(BEGIN + "\n")
    _, end, after = rest.partition(END)
    assert begin and end, f"{DOCS} lost its markers {BEGIN} ... {END}"
    generated = "\n" + "\n".join(reference(name) for name in ("stasis", "stasis-agent"))
    if os.environ.get("REGENERATE_CLI_DOCS") and rest.partition(END)[0] != generated:
        DOCS.write_text(before + begin + generated + end + after)
        pytest.fail(f"{DOCS} rewritten from --help: review and commit it")
    assert rest.partition(END)[0] == generated, (
        f"{DOCS} does not say what --help says: REGENERATE_CLI_DOCS=1 pytest {request.node.nodeid}"
    )
