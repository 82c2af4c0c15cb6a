"""Plausible tool-argument values, as the finite sets the tool-call grammar samples from.

Every value is returned JSON-encoded, so a value sampled character by
character from these sets is valid JSON by construction. The commands only
touch relative paths and never delete anything: they run for real in the
example harness, including on a developer's host in the tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FILES = ("notes.txt", "log.txt", "progress.md", "todo.txt", "results/summary.txt", "out/report.md")
WORDS = ("hello", "world", "done", "plan", "check", "result", "todo", "ok", "step", "summary")


def shell_commands() -> tuple[str, ...]:
    """Shell snippets: appending notes, listing, reading, small python3 one-liners, mkdir, wc."""
    commands: list[str] = ["ls", "ls -la", "pwd", "ls -la results", "ls out"]
    for n in range(1, 21):
        commands.append(f"echo step {n} >> notes.txt")
        commands.append(f"echo 'step {n} done' >> progress.md")
        commands.append(f'echo "check {n}" >> log.txt')
    for word in WORDS:
        commands.append(f"echo {word} > todo.txt")
    for path in FILES:
        commands += [
            f"cat {path}",
            f"wc -l {path}",
            f"wc -c {path}",
            f"head -n 3 {path}",
            f"tail -n 2 {path}",
        ]
    for directory in ("results", "out", "src", "docs", "tmp"):
        commands += [f"mkdir -p {directory}", f"mkdir -p {directory} && ls"]
    for a in range(2, 13):
        for b in range(2, 13):
            commands.append(f"python3 -c 'print({a}*{b})'")
    for n in (5, 10, 20, 100):
        commands.append(f"python3 -c 'print(sum(range({n})))'")
    commands += [
        "python3 -c 'import os; print(sorted(os.listdir()))'",
        "python3 -c 'print(len(open(\"notes.txt\").read().split()))'",
        "grep -c step notes.txt",
        "sort notes.txt | uniq",
        "touch notes.txt && wc -l notes.txt",
    ]
    return tuple(commands)


def file_paths() -> tuple[str, ...]:
    """Relative paths a write_file call may target."""
    return (*FILES, "src/main.py", "hello.py", "README.md", "docs/plan.md", "tmp/scratch.txt")


def file_contents() -> tuple[str, ...]:
    """Small file bodies, several lines each, so the JSON carries escapes."""
    contents: list[str] = []
    for n in range(1, 11):
        contents.append(f"step {n} done\n")
        contents.append(f"# Notes\n\n- item {n}\n- item {n + 1}\n")
        contents.append(f"result = {n} * {n + 1}\nprint(result)\n")
    for word in WORDS:
        contents.append(f"{word}\n")
        contents.append(f'print("{word}")\n')
    contents += ["hello world\n", "TODO: check the results\n", "a\tb\tc\n1\t2\t3\n"]
    return tuple(contents)


def _first_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return kind if isinstance(kind, str) else "string"


def _string_values(tool_name: str, param: str) -> tuple[str, ...]:
    lowered = param.lower()
    if lowered in ("command", "cmd", "script") or tool_name.lower() in ("shell", "bash", "sh", "exec"):
        return shell_commands()
    if "path" in lowered or "file" in lowered or lowered in ("dir", "directory", "filename"):
        return file_paths()
    if lowered in ("content", "contents", "text", "body"):
        return file_contents()
    return WORDS


MAX_NESTED = 8
"""Candidates kept for a nested array or object value: enough variety, a small grammar."""


def _option(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first non-null alternative of an anyOf/oneOf schema, or the schema itself."""
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, Mapping) and option.get("type") != "null":
                    return option
    return schema


def value_candidates(
    tool_name: str, param: str, schema: Mapping[str, Any], depth: int = 0
) -> tuple[str, ...]:
    """JSON-encoded values the grammar may generate for one parameter of one tool, each valid
    against the parameter's schema (enums, nested objects with their required fields, arrays of
    valid items)."""
    schema = _option(schema)
    if "const" in schema:
        return (json.dumps(schema["const"]),)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return tuple(dict.fromkeys(json.dumps(v) for v in enum))
    kind = _first_type(schema)
    if kind == "string":
        return tuple(json.dumps(v) for v in _string_values(tool_name, param))
    if kind in ("integer", "number"):
        # Whole numbers: valid as either, and as what clients that declare "number" often parse.
        low = int(schema.get("minimum", 0)) if isinstance(schema.get("minimum"), int | float) else 0
        return tuple(str(n) for n in range(max(low, 0), max(low, 0) + 21))
    if kind == "boolean":
        return ("true", "false")
    if kind == "array":
        items = schema.get("items")
        items = items if isinstance(items, Mapping) else {}
        inner = value_candidates(tool_name, param, items, depth + 1)[:MAX_NESTED] if depth < 3 else ()
        empty = () if schema.get("minItems", 0) else ("[]",)
        return (*empty, *(f"[{v}]" for v in inner)) or ("[]",)
    if kind == "object":
        fields = argument_properties(schema) if depth < 3 else []
        if not fields:
            return ("{}",)
        options = [value_candidates(tool_name, name, sub, depth + 1) for name, sub in fields]
        return tuple(
            dict.fromkeys(
                "{"
                + ", ".join(
                    f"{json.dumps(name)}: {values[k % len(values)]}"
                    for (name, _), values in zip(fields, options, strict=True)
                )
                + "}"
                for k in range(MAX_NESTED)
            )
        )
    return ("null",)


def argument_properties(parameters: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The properties a generated call fills, in schema order: the required ones, or all if none are."""
    properties = parameters.get("properties")
    if not isinstance(properties, Mapping):
        return []
    required = parameters.get("required")
    names = (
        [n for n in required if n in properties]
        if isinstance(required, list) and required
        else list(properties)
    )
    return [(n, properties[n] if isinstance(properties[n], Mapping) else {}) for n in names]
