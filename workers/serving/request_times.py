"""Engine-side request times, observed where requests run (GPU workers, which serve no
/metrics, or the embedded server) and added up in Redis (tenants/counters.py): how long a
request waited in the fair queue, then, from the engine taking it, its first token and its time
per output token. The API-side figures (routing/metrics.py) add the API's own work and the
network."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily

from tenants.counters import SharedHistograms

logger = logging.getLogger(__name__)


QUEUE_WAIT = SharedHistograms(
    "fl:metrics:queue-wait", (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
)
ENGINE_TTFT = SharedHistograms(
    "fl:metrics:engine-ttft",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40),
)
ENGINE_TPOT = SharedHistograms(
    "fl:metrics:engine-tpot",
    (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5),
)
TIMES = (
    (
        QUEUE_WAIT,
        "fairlane_queue_wait_seconds",
        "time a request waited in the fair queue before a worker took it",
        ["model", "lane"],
    ),
    (
        ENGINE_TTFT,
        "fairlane_engine_time_to_first_token_seconds",
        "time from the engine taking a request to its first token",
        ["model"],
    ),
    (
        ENGINE_TPOT,
        "fairlane_engine_time_per_output_token_seconds",
        "a request's mean time between output tokens after the first, in the engine",
        ["model"],
    ),
)


def request_times_observe(timeline: dict[str, Any], *, model: str, output_tokens: int) -> None:
    """A finished run's times, from its timeline (workers/serving/trace.py)."""
    taken, first, last = (timeline.get(k) for k in ("taken", "first_token", "last_token"))
    if taken is None:
        return
    if "queued" in timeline and "lane" in timeline:
        QUEUE_WAIT.observe((model, timeline["lane"]), taken - timeline["queued"])
    if first is not None:
        ENGINE_TTFT.observe((model,), first - taken)
        if output_tokens > 1 and last is not None:
            ENGINE_TPOT.observe((model,), (last - first) / (output_tokens - 1))


class RequestTimesCollector:
    """The engine-side histograms above, from every process's observations (`client`: the
    runtime's Redis, set when a runtime is installed; None: this process's alone)."""

    client: Any = None  # a Redis client

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(name, text, labels=labels) for _, name, text, labels in TIMES]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for histograms, name, text, labels in TIMES:
            family = HistogramMetricFamily(name, text, labels=labels)
            try:
                found = histograms.families(self.client)
            except Exception:  # a scrape must not fail because Redis blinked
                logger.exception("%s unavailable", name)
                found = {}
            for values, (buckets, total) in sorted(found.items()):
                if len(values) == len(labels):
                    family.add_metric(list(values), buckets, total)
            yield family
