"""How `stasis image import` shows the nodes' pulls: bars on a terminal, event lines otherwise."""

from __future__ import annotations

import io

import pytest

from orchestrator.cli.progress import PullBoard
from orchestrator.domain import PullStatus

MiB = 1 << 20


def _feed(board: PullBoard) -> None:
    for done in (0, 10, 30, 60, 90, 100):
        board(PullStatus("node-1", "fetching", done * MiB, 100 * MiB))
        board(PullStatus("node-2", "waiting"))
    board(PullStatus("node-1", "unpacking", 100 * MiB, 100 * MiB))
    board(PullStatus("node-2", "fetching", 5 * MiB, 0))
    board(PullStatus("node-1", "done"))
    board(PullStatus("node-2", "done"))
    board.close()


@pytest.mark.timeout(10)
def test_off_a_terminal_each_phase_and_each_quarter_of_the_bytes_is_one_line() -> None:
    out = io.StringIO()
    _feed(PullBoard(out, terminal=False))
    assert out.getvalue().splitlines() == [
        "node-1: fetching 0% of 100.0MiB",
        "node-2: waiting",
        "node-1: fetching 30% of 100.0MiB",
        "node-1: fetching 60% of 100.0MiB",
        "node-1: fetching 90% of 100.0MiB",
        "node-1: fetching 100% of 100.0MiB",
        "node-1: unpacking",
        "node-2: fetching 5.0MiB",
        "node-1: done",
        "node-2: done",
    ]


@pytest.mark.timeout(10)
def test_on_a_terminal_one_line_of_bars_is_redrawn_and_ended() -> None:
    out = io.StringIO()
    board = PullBoard(out, terminal=True)
    board(PullStatus("node-1", "fetching", 25 * MiB, 100 * MiB))
    board(PullStatus("node-2", "unpacking"))
    assert out.getvalue().split("\r\x1b[K")[-1] == (
        "node-1 [#####---------------] 25.0MiB/100.0MiB  node-2 unpacking"
    )
    board(PullStatus("node-1", "done"))
    board(PullStatus("node-2", "done"))
    board.close()
    assert out.getvalue().endswith("\r\x1b[Knode-1 done  node-2 done\n")
