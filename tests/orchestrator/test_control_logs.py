"""Logs (`control/logs.py`): each run's log, wherever it is now.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

import pytest

from orchestrator.domain import InvalidArgument
from tests.orchestrator.loops import Loop, S


@pytest.mark.timeout(30)
def test_logs_read_each_run_in_order_from_wherever_the_log_is_now(loop: Loop) -> None:
    episode_id = loop.running()
    first = loop.store.episodes.get(episode_id)
    loop.agents.logs[first.sandbox_id] = b"run one\n"
    assert loop.control.logs.page(episode_id).content == b"run one\n", "read from the live sandbox"
    loop.control.commands.preempt(episode_id, "by hand")
    loop.until("PREEMPTED", lambda: loop.state(episode_id) == S.PREEMPTED)
    page = loop.control.logs.page(episode_id)
    assert (page.content, page.complete) == (b"run one\n", False), "read from the snapshot; more will come"
    loop.control.commands.resume(episode_id, "")
    loop.until("RUNNING again", lambda: loop.state(episode_id) == S.RUNNING)
    second = loop.store.episodes.get(episode_id)
    assert second.log_offsets == (0, len(b"run one\n"))
    loop.agents.logs[second.sandbox_id] += b"run two\n"
    loop.node(second.node).exit(second.sandbox_id, 0)
    loop.until("SUCCEEDED", lambda: loop.state(episode_id) == S.SUCCEEDED)
    del loop.agents.logs[second.sandbox_id]  # the sandbox is gone: the kept log answers
    assert loop.control.logs.page(episode_id).content == b"run one\nrun two\n"
    one, two = loop.control.logs.page(episode_id, run=1), loop.control.logs.page(episode_id, run=2)
    assert (one.content, one.complete, two.content, two.complete) == (b"run one\n", True, b"run two\n", True)
    assert loop.control.logs.page(episode_id, run=2, offset=4).content == b"two\n"
    with pytest.raises(InvalidArgument, match=r"^run: episode .* has had 2 run\(s\)"):
        loop.control.logs.page(episode_id, run=3)
