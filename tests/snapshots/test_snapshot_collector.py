"""`collector_paused`: the cyclic collector stays off until the last pause in the process ends;
`set_aside_startup_objects`: a full collection no longer walks what the process started with."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from snapshots import collector_paused, set_aside_startup_objects


@pytest.mark.timeout(10)
def test_the_collector_resumes_when_the_last_pause_ends_whichever_thread_began_it() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the inner pause ended, the outer one did not"
    assert gc.isenabled()

    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            entered.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    pause = collector_paused()
    pause.__enter__()
    thread.start()
    entered.wait(5)
    pause.__exit__(None, None, None)  # the first pause ends while the other thread's goes on
    assert not gc.isenabled()
    leave.set()
    thread.join(5)
    assert gc.isenabled()


@pytest.mark.timeout(10)
def test_a_collector_that_was_off_stays_off_and_an_error_ends_the_pause() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("the body failed")
    assert gc.isenabled()


@pytest.mark.timeout(30)
def test_what_a_process_started_with_is_set_aside_and_later_cycles_are_still_collected() -> None:
    started_with = [[n] for n in range(1000)]
    set_aside_startup_objects()
    try:
        assert gc.get_freeze_count() >= len(started_with)
        assert not any(o is started_with for o in gc.get_objects()), "a full collection would walk it"
        later: list[object] = []
        assert any(o is later for o in gc.get_objects())

        class Cycle:
            me: Cycle

        cycle = Cycle()
        cycle.me = cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None, "a cycle made after the start is collected as before"
        assert started_with[999] == [999]
    finally:
        gc.unfreeze()
