"""The verifier (`control/verifier.py`): what a reward may be."""

from __future__ import annotations

import re

import pytest

from orchestrator.control.verifier import parse_reward


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("log", "words"),
    [
        (b"ok\nnan\n", "'nan' is not a finite number"),
        (b"inf\n", "'inf' is not a finite number"),
        (b"-Infinity\n\n", "'-Infinity' is not a finite number"),
        (b"1e400\n", "'1e400' is not a finite number"),
        (b"one\n", "'one' is not a number"),
        (b"\n \n", "printed nothing"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_refused(log: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_reward(log)
    assert parse_reward(b"noise\n0.25\n") == 0.25
