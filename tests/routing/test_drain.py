"""The drain's cut, on a real event loop: a request that outlives the deadline is cut and ends
with Drained; one whose first cancellation was swallowed by the code it was in, or that
entered its watch only after the deadline, is cut by the next round (the chaos test
tests/chaos/test_sigterm_drain.py drives the whole shutdown over real processes)."""

import asyncio

import pytest
from django.test import override_settings

from routing import drain as drain_module
from routing.drain import Drain, Drained

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def quick_rounds(monkeypatch):
    monkeypatch.setattr(drain_module, "CUT_REPEAT_SECONDS", 0.05)


async def _request(drain: Drain, body) -> str:
    try:
        async with drain.watch():
            await body()
    except Drained:
        return "drained"
    return "finished"


async def _outcome(task: asyncio.Task) -> str:
    """The request's end within 2 s (not wait_for: its own cancel would look like a cut)."""
    done, _ = await asyncio.wait({task}, timeout=2)
    return task.result() if done else "still running"


async def _forever():
    await asyncio.sleep(3600)


async def _swallows_one_cancel():
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # as a library that mistakes the cut for a timeout of its own might
    await asyncio.sleep(3600)


@override_settings(FAIRLANE_DRAIN_TIMEOUT_SECONDS=0)
async def test_a_request_that_outlives_the_deadline_is_drained():
    drain = Drain()
    running = asyncio.ensure_future(_request(drain, _forever))
    quick = asyncio.ensure_future(_request(drain, lambda: asyncio.sleep(0)))
    await asyncio.sleep(0.01)
    drain.begin()
    assert await _outcome(running) == "drained"
    assert await quick == "finished"
    assert not drain.tasks


@override_settings(FAIRLANE_DRAIN_TIMEOUT_SECONDS=0)
async def test_a_swallowed_cut_is_sent_again():
    drain = Drain()
    running = asyncio.ensure_future(_request(drain, _swallows_one_cancel))
    await asyncio.sleep(0.01)
    drain.begin()
    assert await _outcome(running) == "drained"


@override_settings(FAIRLANE_DRAIN_TIMEOUT_SECONDS=0)
async def test_a_request_entering_its_watch_after_the_deadline_is_cut_too():
    drain = Drain()
    drain.begin()
    await asyncio.sleep(0.1)  # past the deadline, one round done with nothing to cut
    late = asyncio.ensure_future(_request(drain, _forever))
    assert await _outcome(late) == "drained"


async def test_a_cancel_that_is_not_the_drains_passes_through():
    drain = Drain()
    running = asyncio.ensure_future(_request(drain, _forever))
    await asyncio.sleep(0.01)
    running.cancel()  # the client left: not the drain's business
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not drain.tasks
