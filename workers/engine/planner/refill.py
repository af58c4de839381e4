"""How long a full worker's freed slot stays empty, read from what its requests' timelines say.

When a request ends on a worker that was full, the worker's acknowledgement wakes its puller,
which reads the engine between two steps, takes the next request from the fair queue and hands
it to a runner thread: the slot stays empty meanwhile (about 13 ms on `tiny` on the 2-core
machine, three or four of its steps). The simulation leaves a slot freed while the worker was
full empty this long (``ServerShape.refill_s``); this module measures it from the ledger's
timelines (each request's ``queued``, ``taken`` and ``last_token``, and its ``worker``).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

# Fewer gaps than this and the median says little: no figure (the simulation's default).
MIN_GAPS = 20


@dataclass(frozen=True, slots=True)
class Timeline:
    worker: str
    queued: float
    taken: float
    last_token: float


def refill_seconds(timelines: Iterable[Timeline], *, full: int) -> float | None:
    """The median time from a request's end, on a worker then running `full` requests or more,
    to that worker's next take, counting only ends with a request already queued (so the slot
    waited for the puller, not for an arrival); None with fewer than MIN_GAPS such ends."""
    by_worker: dict[str, list[Timeline]] = {}
    for timeline in timelines:
        by_worker.setdefault(timeline.worker, []).append(timeline)
    gaps = []
    for rows in by_worker.values():
        rows.sort(key=lambda t: t.taken)
        takes = [t.taken for t in rows]
        ends = sorted(t.last_token for t in rows)
        for row in rows:
            end = row.last_token
            running = bisect.bisect_left(takes, end) - bisect.bisect_left(ends, end)
            following = bisect.bisect_right(takes, end)
            if running < full or following == len(rows):
                continue
            nxt = rows[following]  # the next it took: queued before the end, so it waited
            if nxt.queued < end:
                gaps.append(nxt.taken - end)
    return statistics.median(gaps) if len(gaps) >= MIN_GAPS else None
