"""A Harbor task's reward, as Stasis's grader (`grader.sh`) reports what the task's tests wrote.

The grader's last output line is `stasis-task exit=<code> <file> <content>`: the exit code of
`bash /tests/test.sh`, then `reward.txt` or `reward.json` with that file's content on one line,
or `none`. A run that failed, or wrote no reward or a malformed one, is an error naming why:
the episode then FAILS with it, never scores zero.
"""

from __future__ import annotations

import json
import math
import re

MARK = "stasis-task"
LINE = re.compile(rf"^{MARK} exit=(\d+) (reward\.txt|reward\.json|none)(?: (.*))?$")
TIMED_OUT = 124
"""The exit code `timeout` gives a command it stopped."""
MAX_METRICS = 64
MAX_NAME = 128


def read_reward(log: bytes) -> tuple[float, dict[str, float]]:
    """The reward and the named metrics beside it, from the grader's output.

    reward.txt holds one number. reward.json holds an object of named numbers: the reward is its
    `reward` key, or its only key; the other keys are metrics. ValueError says what is wrong."""
    lines = [line.strip() for line in log.decode(errors="replace").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    match = LINE.match(last)
    if match is None:
        raise ValueError(f"the grader ended without its {MARK!r} line (last line {last[:120]!r})")
    code, file, content = int(match.group(1)), match.group(2), (match.group(3) or "").strip()
    if code == TIMED_OUT:
        raise ValueError("the tests (bash /tests/test.sh) ran past [verifier] timeout_sec")
    if code != 0:
        raise ValueError(f"the tests (bash /tests/test.sh) exited with code {code}")
    if file == "none":
        raise ValueError("the tests wrote no reward (/logs/verifier/reward.txt or reward.json)")
    if file == "reward.txt":
        return _number("reward.txt", content), {}
    return _from_json(content)


def _from_json(content: str) -> tuple[float, dict[str, float]]:
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise ValueError(f"reward.json is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError('reward.json must be an object of named numbers, such as {"reward": 1}')
    if len(data) > MAX_METRICS:
        raise ValueError(f"reward.json has {len(data)} keys; at most {MAX_METRICS}")
    values = {}
    for name, value in data.items():
        if not name or len(name) > MAX_NAME:
            raise ValueError(f"reward.json key {name[:40]!r} must be 1 to {MAX_NAME} characters")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"reward.json's {name!r} is {json.dumps(value)[:60]}, not a number")
        values[name] = _number(f"reward.json's {name!r}", value)
    if "reward" in values:
        main = "reward"
    elif len(values) == 1:
        (main,) = values
    else:
        raise ValueError(
            f"reward.json has keys {', '.join(sorted(values))[:200]} and no 'reward': "
            "name the one that is the reward 'reward'"
        )
    return values.pop(main), values


def _number(what: str, value: str | float) -> float:
    """A finite number: neither nan, nor inf, nor 1e400."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{what} {str(value)[:60]!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} {str(value)[:60]!r} is not a finite number")
    return number
