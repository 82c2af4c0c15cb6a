"""Generation slots shared fairly: a harness that sends many requests at once waits behind
itself, never in front of a neighbour, and a request that waits too long is refused."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchestrator.gateway.slots import FairSlots, SlotTimeout
from orchestrator.reference_model import ReferenceModelServer, ReferenceModelSettings
from orchestrator.trajectory import Ledger
from tests.orchestrator.worlds import USER, make_episode, make_world


def test_a_neighbour_is_served_at_the_next_free_slot_whatever_the_greedy_one_queued() -> None:
    async def run() -> list[tuple[str, int]]:
        slots = FairSlots(total=2, per_episode=2)
        served: list[tuple[str, int]] = []

        async def turn(episode: str, n: int) -> None:
            async with slots.hold(episode, 5):
                served.append((episode, n))
                await asyncio.sleep(0.05)

        greedy = [asyncio.create_task(turn("greedy", n)) for n in range(8)]
        await asyncio.sleep(0.01)
        neighbour = asyncio.create_task(turn("neighbour", 0))
        await asyncio.gather(*greedy, neighbour)
        assert slots.busy == 0
        return served

    served = asyncio.run(run())
    # Two greedy turns held both slots; the neighbour, holding none, took the first that came free.
    assert served.index(("neighbour", 0)) == 2


def test_one_episode_holds_at_most_its_share_and_a_long_wait_is_refused() -> None:
    async def run() -> None:
        slots = FairSlots(total=4, per_episode=1)
        async with slots.hold("a", 1):
            with pytest.raises(SlotTimeout, match=r"within 0\.05 s"):
                async with slots.hold("a", 0.05):
                    pass
            async with slots.hold("b", 0.05):  # free slots, another episode: at once
                assert (slots.held("a"), slots.held("b"), slots.busy) == (1, 1, 2)
        assert slots.busy == 0

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_a_greedy_harness_does_not_delay_a_neighbours_turn_beyond_one_generation(tmp_path: Path) -> None:
    """Two slots, two per episode: one episode sends eight requests at once, each taking 0.5 s
    upstream; a neighbour's request, sent just after, waits for one generation at most, where
    first come, first served would have made it wait for four."""
    delay = 0.5
    model = ReferenceModelServer(ReferenceModelSettings(seed=3)).start()
    world = make_world(tmp_path, model.url, model, Ledger.sqlite(tmp_path / "l.db"), max_concurrent_turns=2,
                       max_turns_per_episode=2)  # fmt: skip
    world.episodes["ep-2"] = make_episode("ep-2", "tok-2")
    chat = type(model.model).chat_answer

    def slow(body: Any) -> Any:
        time.sleep(delay)
        return chat(model.model, body)

    model.model.chat_answer = slow  # type: ignore[method-assign]
    assert world.gateway.logprobs_mode("reference") == "processed"

    async def run() -> float:
        loop = asyncio.get_running_loop()
        clients = ThreadPoolExecutor(max_workers=9)  # a connection each
        greedy = [loop.run_in_executor(clients, world.post, {**_body(), "seed": n}) for n in range(8)]
        await asyncio.sleep(0.1)
        started = time.monotonic()
        status, _ = await loop.run_in_executor(clients, lambda: world.post(_body(), token="tok-2"))
        waited = time.monotonic() - started
        assert status == 200
        assert all(status == 200 for status, _ in await asyncio.gather(*greedy))
        return waited

    try:
        waited = asyncio.run(run())
    finally:
        world.gateway.stop()
        model.stop()
    # At most the generation under way, then its own.
    assert waited < 2 * delay + 0.4, f"the neighbour waited {waited:.2f} s"


def _body() -> dict[str, Any]:
    return {"model": "reference", "messages": [USER], "max_tokens": 8}
