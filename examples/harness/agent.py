#!/usr/bin/env python3
"""Example Stasis harness: an agent loop against an OpenAI-compatible endpoint with shell and write_file tools.

Standard library only: it runs inside a minimal Debian sandbox with python3,
and needs no Stasis code. Preemption reaches it only as dropped connections
(a frozen sandbox is restored elsewhere with its TCP connections closed), so
every model request is resent, byte for byte, until it gets an answer; the
gateway serves an already-recorded turn from its ledger.

Environment:
  OPENAI_BASE_URL           endpoint, e.g. http://169.254.1.1:8080/v1
  OPENAI_API_KEY            sent as "Authorization: Bearer <key>" (optional)
  STASIS_MODEL              model name (default: reference)
  HARNESS_MAX_TURNS         model turns before stopping without an answer (default: 30)
  HARNESS_WORKDIR           where tools run and results are written (default: /work)
  HARNESS_TASK_FILE         task prompt (default: /task/prompt.txt; a built-in task if absent)
  HARNESS_SHELL_TIMEOUT     seconds per shell command (default: 60)
  HARNESS_REQUEST_TIMEOUT   seconds to wait for one model response (default: 600)
  HARNESS_SERVER_RETRIES    retries of a request answered 5xx/408/429 (default: 5)
  HARNESS_RETRY_DELAY       first retry delay in seconds, doubled per retry (default: 0.5)

Writes <workdir>/progress.json after every turn and <workdir>/answer.txt at the end.
Exit codes: 0 finished (answered or out of turns), 2 the endpoint refused a
request (4xx), 3 the endpoint kept failing (5xx or responses that are not
chat completions).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTPUT_LIMIT = 4096
"""Characters of tool output sent back to the model; enough to be useful, small enough to keep prompts short."""
CONNECTION_RETRY_CAP = 2.0
"""Longest pause between resends after a dropped connection: a restore takes about a second."""
TRANSIENT_STATUSES = (408, 429)
DEFAULT_TASK = (
    "Work in the current directory. Keep notes of each step in notes.txt, check your work with the shell, "
    "then answer with a short summary of what you did."
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in the working directory and return its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command line for /bin/sh."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file (relative paths are inside the working directory).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]


class RequestRefused(Exception):
    """The endpoint answered 4xx: resending the same request cannot help."""


class EndpointFailing(Exception):
    """The endpoint kept answering 5xx (or garbage) past the retry budget."""


@dataclass(frozen=True)
class HarnessSettings:
    """Everything the harness reads from its environment, once, at start-up."""

    base_url: str
    api_key: str
    model: str
    max_turns: int
    workdir: Path
    task_file: Path
    shell_timeout: float
    request_timeout: float
    server_retries: int
    retry_delay: float
    step_delay: float

    @classmethod
    def from_env(cls, env: dict[str, str]) -> HarnessSettings:
        """Settings from environment variables, with the documented defaults."""
        return cls(
            base_url=env.get("OPENAI_BASE_URL", "http://169.254.1.1:8080/v1").rstrip("/"),
            api_key=env.get("OPENAI_API_KEY", ""),
            model=env.get("STASIS_MODEL", "reference"),
            max_turns=int(env.get("HARNESS_MAX_TURNS", "30")),
            workdir=Path(env.get("HARNESS_WORKDIR", "/work")),
            task_file=Path(env.get("HARNESS_TASK_FILE", "/task/prompt.txt")),
            shell_timeout=float(env.get("HARNESS_SHELL_TIMEOUT", "60")),
            request_timeout=float(env.get("HARNESS_REQUEST_TIMEOUT", "600")),
            server_retries=int(env.get("HARNESS_SERVER_RETRIES", "5")),
            retry_delay=float(env.get("HARNESS_RETRY_DELAY", "0.5")),
            step_delay=float(env.get("HARNESS_STEP_DELAY_S", "0")),
        )


def log(line: str) -> None:
    """One line to stdout, which the sandbox redirects to its log file."""
    print(line, flush=True)


class ModelEndpoint:
    """POSTs chat completions, resending the same bytes until the endpoint answers."""

    def __init__(self, settings: HarnessSettings) -> None:
        self._settings = settings
        # No proxies: inside the sandbox the gateway is the only reachable address.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def complete(self, body: bytes, turn: int) -> dict[str, Any]:
        """The decoded response to body; retries dropped connections forever and 5xx a few times."""
        settings = self._settings
        headers = {"Content-Type": "application/json"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        url = f"{settings.base_url}/chat/completions"
        attempt = server_failures = 0
        while True:
            attempt += 1
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=settings.request_timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as error:
                with error:
                    detail = error.read()[:500].decode("utf-8", errors="replace")
                if error.code < 500 and error.code not in TRANSIENT_STATUSES:
                    raise RequestRefused(f"HTTP {error.code}: {detail}") from None
                server_failures += 1
                if server_failures > settings.server_retries:
                    raise EndpointFailing(
                        f"HTTP {error.code} after {settings.server_retries} retries: {detail}"
                    ) from None
                delay = min(settings.retry_delay * 2 ** (server_failures - 1), 30.0)
                log(f"turn {turn}: retry {attempt} in {delay:.2f}s after HTTP {error.code}")
                time.sleep(delay)
                continue
            except (OSError, http.client.HTTPException) as error:
                # Reset, refused, broken pipe, remote disconnect, truncated body, timeout: the
                # connection died (a restore closes every TCP connection), not the request.
                delay = min(0.1 * 2 ** min(attempt - 1, 5), CONNECTION_RETRY_CAP)
                log(f"turn {turn}: retry {attempt} in {delay:.2f}s after {type(error).__name__}: {error}")
                time.sleep(delay)
                continue
            try:
                payload = json.loads(raw)
                if not isinstance(payload["choices"][0]["message"], dict):
                    raise TypeError("choices[0].message is not an object")
            except (ValueError, KeyError, IndexError, TypeError) as error:
                server_failures += 1
                if server_failures > settings.server_retries:
                    raise EndpointFailing(f"not a chat completion: {raw[:200]!r}") from error
                log(f"turn {turn}: retry {attempt} after an unreadable response: {error}")
                time.sleep(settings.retry_delay)
                continue
            return dict(payload)


def _truncate(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[:OUTPUT_LIMIT] + f"\n[... {len(text) - OUTPUT_LIMIT} more characters truncated]"


def run_shell(command: str, workdir: Path, timeout: float) -> str:
    """Run one shell command; the tool result is its exit code and combined output."""
    # The model writes shell, so this one call does go through /bin/sh on purpose.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Kill the whole process group: the command may have started children of its own.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return _truncate(f"timed out after {timeout:g}s\n" + out.decode("utf-8", errors="replace"))
    return _truncate(f"exit code {proc.returncode}\n" + out.decode("utf-8", errors="replace"))


def write_file(path: str, content: str, workdir: Path) -> str:
    """Write content to path (relative to workdir); the tool result says how much was written."""
    target = workdir / path
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode()
    target.write_bytes(data)
    return f"wrote {len(data)} bytes to {path}"


def execute(call: dict[str, Any], settings: HarnessSettings) -> str:
    """Run one tool call; any failure becomes the tool result so the model can react to it."""
    function = call.get("function") or {}
    name = function.get("name")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
        if name == "shell":
            return run_shell(str(arguments["command"]), settings.workdir, settings.shell_timeout)
        if name == "write_file":
            return write_file(str(arguments["path"]), str(arguments["content"]), settings.workdir)
        return f"error: unknown tool {name!r}"
    except (ValueError, KeyError, TypeError, OSError) as error:
        return f"error: {type(error).__name__}: {error}"


def write_progress(workdir: Path, turn: int, status: str, tool_calls: int) -> None:
    """Replace progress.json atomically, so a snapshot never catches it half-written."""
    state = {"turn": turn, "status": status, "tool_calls": tool_calls}
    tmp = workdir / ".progress.json.tmp"
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, workdir / "progress.json")


def run(settings: HarnessSettings) -> int:
    """The agent loop; returns the process exit code."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    task = settings.task_file.read_text() if settings.task_file.is_file() else DEFAULT_TASK
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are an agent in a sandbox. Use the shell and write_file tools, then answer briefly.",
        },
        {"role": "user", "content": task},
    ]
    endpoint = ModelEndpoint(settings)
    tool_calls = 0
    answer = ""
    status = "max_turns"
    write_progress(settings.workdir, 0, "running", 0)
    for turn in range(1, settings.max_turns + 1):
        body = json.dumps(
            {"model": settings.model, "messages": messages, "tools": TOOLS, "tool_choice": "auto"}
        ).encode()
        try:
            response = endpoint.complete(body, turn)
        except RequestRefused as error:
            log(f"turn {turn}: endpoint refused the request: {error}")
            write_progress(settings.workdir, turn - 1, "refused", tool_calls)
            return 2
        except EndpointFailing as error:
            log(f"turn {turn}: endpoint keeps failing: {error}")
            write_progress(settings.workdir, turn - 1, "endpoint_failing", tool_calls)
            return 3
        message = response["choices"][0]["message"]
        # Appended exactly as returned: the next prompt must extend this one token for token.
        messages.append(message)
        calls = message.get("tool_calls") or []
        answer = message.get("content") or ""
        if not calls:
            log(f"turn {turn}: answer ({len(answer)} chars)")
            write_progress(settings.workdir, turn, "answered", tool_calls)
            status = "answered"
            break
        log(f"turn {turn}: tool {', '.join(str((c.get('function') or {}).get('name')) for c in calls)}")
        for call in calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "content": execute(call, settings)}
            )
        tool_calls += len(calls)
        write_progress(settings.workdir, turn, "running", tool_calls)
        # Stands in for the minutes real tools take between model calls.
        time.sleep(settings.step_delay)
    else:
        log(f"no answer after {settings.max_turns} turns")
        write_progress(settings.workdir, settings.max_turns, "max_turns", tool_calls)
    (settings.workdir / "answer.txt").write_text(answer)
    log(f"done: {status}, answer in {settings.workdir / 'answer.txt'}")
    return 0


def main() -> int:
    """Entry point."""
    try:
        settings = HarnessSettings.from_env(dict(os.environ))
    except ValueError as error:
        log(f"bad harness configuration: {error}")
        return 2
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
