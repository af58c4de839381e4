"""How long a full worker's freed slot stays empty, read from what its requests' timelines say.

When a request ends on a worker that was full, the worker's acknowledgement wakes its puller,
which reads the engine between two steps, takes the next request from the fair queue and hands
it to a runner thread, which submits it to the engine: the slot stays empty meanwhile (about
20 ms on `tiny` on the 2-core machine, four or five of its steps). One puller refills the slots
one after another, so a slot freed while an earlier one still waits for its refill waits longer
(25-30 ms on `tiny`). The simulation leaves a slot freed while the worker was full (counting the
slots still waiting for their refill as taken) empty this long (``ServerShape.refill_s``); this
module measures it from the ledger's timelines (each request's ``queued``, ``taken``,
``submitted`` and ``last_token``, and its ``worker``).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# Fewer gaps than this and the mean says little: no figure (the simulation's default).
MIN_GAPS = 20


@dataclass(frozen=True, slots=True)
class Timeline:
    worker: str
    queued: float
    taken: float
    last_token: float
    # When the runner thread handed it to the engine (the timeline's `submitted`); rows
    # written before it was recorded have none, and their take stands in for it.
    submitted: float | None = None

    @property
    def entered(self) -> float:
        return self.taken if self.submitted is None else self.submitted


def refill_seconds(timelines: Iterable[Timeline], *, full: int) -> float | None:
    """The mean time a slot freed on a worker then holding `full` requests or more (its slots
    still waiting for a refill counted in) stayed empty: from the request's end until the
    worker's engine received the request that refilled it, the freed slots refilled in the
    order they were freed. A refill by a request that arrived after the slot was freed waited
    for that arrival, not for the puller: it is left out. The mean, not the median: the slot
    time lost, which is what the worker's throughput pays, is the sum of the gaps. None with
    fewer than MIN_GAPS gaps."""
    by_worker: dict[str, list[Timeline]] = {}
    for timeline in timelines:
        by_worker.setdefault(timeline.worker, []).append(timeline)
    gaps = []
    for rows in by_worker.values():
        # (time, 0 for an end or 1 for an entry, the row): an end at the very moment of an
        # entry frees its slot first
        events = sorted(
            [(row.last_token, 0, row) for row in rows] + [(row.entered, 1, row) for row in rows],
            key=lambda event: event[:2],
        )
        running, freed = 0, deque[float]()
        for at, kind, row in events:
            if kind == 1:
                running += 1
                if freed:
                    end = freed.popleft()
                    if row.queued < end:  # it waited in the queue while the slot was empty
                        gaps.append(at - end)
                continue
            if running + len(freed) >= full:
                freed.append(at)
            running -= 1
    return statistics.fmean(gaps) if len(gaps) >= MIN_GAPS else None
