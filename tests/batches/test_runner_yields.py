"""In the embedded mode the batch runner gives way to interactive requests on its process's
engines: one line a round, and a pause before the next, while one ran in the last half
second; FAIRLANE_BATCH_IN_FLIGHT lines otherwise, and always beside no engine (the
distributed mode). `bench batches` measures what it buys."""

import time

import pytest

from routing.batches.runner import INTERACTIVE_RECENT_SECONDS, BatchRunner
from routing.runtimes import runtime_build
from tests.routing.conftest import PRICES
from workers.serving.catalog import model_get
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db


def test_the_runner_takes_one_line_while_an_interactive_request_ran_here(settings):
    settings.FAIRLANE_BATCH_IN_FLIGHT = 8
    model_register(name="tiny", source="preset:tiny", **PRICES)
    runtime = runtime_build("embedded", redis_url="")
    try:
        engine = runtime.engine_host.load(model_get(name="tiny"))
        runner = BatchRunner(runtime)
        assert runner.line_room() == (8, False)  # nothing interactive has run
        scheduler = engine.engine.scheduler
        assert scheduler.config.yield_lanes == ("bulk",)  # the CPU's default
        scheduler.foreground_at = time.monotonic()  # as a standard-lane sequence leaves it
        assert runner.line_room() == (1, True)
        scheduler.foreground_at = time.monotonic() - INTERACTIVE_RECENT_SECONDS - 0.01
        assert runner.line_room() == (8, False)
    finally:
        runtime.engine_host.shutdown()


def test_a_runner_beside_no_engine_never_gives_way(settings):
    settings.FAIRLANE_BATCH_IN_FLIGHT = 3
    runtime = runtime_build("distributed")
    assert runtime.engine_host is None
    assert BatchRunner(runtime).line_room() == (3, False)
