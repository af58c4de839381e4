"""One request run on a hosted engine, wherever it runs (the embedded mode's thread pool or a
Celery GPU worker thread): submit its sequences, pass their outputs on as events
(workers/events.py), and settle its budget reservation with what was actually generated,
exactly once (workers/settlement.py). The run itself, outputs to events, is workers/runs.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import AsyncIterator

from workers.engine import AsyncEngine
from workers.events import Accepted, Event
from workers.fairqueue.local import local_queue
from workers.jobs import GenerationJob
from workers.runs import GenerationRun
from workers.settlement import Emit, settlement_track

logger = logging.getLogger(__name__)


class LostOwnership(Exception):
    """Another worker took this request over (this one's claim lapsed): stop at once, and
    leave its settlement to the new owner."""


def generation_run_blocking(job: GenerationJob, engine: AsyncEngine, emit: Emit, *,
                            backend: str) -> None:
    """Run a request on this thread (a GPU worker's task) and settle it. Raises only
    LostOwnership (nothing settled then); an emit that fails otherwise (Redis went away)
    stops the run, which is still settled. A worker thread is a process boundary."""
    inbox: queue.Queue = queue.Queue()
    with GenerationRun(job, engine, backend=backend) as run:
        try:
            run.submit(lambda index: lambda item: inbox.put((index, item)))
            for event in [Accepted(), *run.backlog]:
                emit(event)
            while run.remaining:
                for event in run.absorb(*inbox.get()):
                    emit(event)
        except LostOwnership:
            run.cancel()
            _drain(run, lambda timeout: inbox.get(timeout=timeout), queue.Empty)
            raise
        except Exception as exc:
            _emit_quietly(emit, run.fail(exc))
            _drain(run, lambda timeout: inbox.get(timeout=timeout), queue.Empty)
    run.settle(lambda event: _emit_quietly(emit, event))


def _emit_quietly(emit: Emit, event: Event) -> None:
    """An event nobody may be able to receive any more (the stream's store failed)."""
    try:
        emit(event)
    except Exception as exc:
        logger.warning("could not send a %s event: %s: %s", type(event).__name__,
                       type(exc).__name__, exc)


async def generation_run_async(job: GenerationJob, engine: AsyncEngine, *,
                               backend: str) -> AsyncIterator[Event]:
    """Run a request with its outputs arriving on this event loop (the embedded mode: no
    thread per request). Closing the iterator early (the client left) aborts the run; it is
    settled, with every token it made, either way."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    run = GenerationRun(job, engine, backend=backend)
    tail: list[Event] = []
    where = {"model": job.model["name"], "lane": job.lane, "tenant": str(job.tenant_id)}
    waiting = False
    with run:
        try:
            # No fair queue here: the engine takes it at once (its own scheduler orders what
            # it has by lane and tenant).
            job.timeline.update(taken=time.time(), worker=backend, lane=job.lane)
            run.submit(lambda index: lambda item: loop.call_soon_threadsafe(
                inbox.put_nowait, (index, item)))
            local_queue.enter(**where)  # admission counts it until its first output
            waiting = True
            for event in [Accepted(), *run.backlog]:
                yield event
            while run.remaining:
                item = await inbox.get()
                if waiting:
                    waiting = False
                    local_queue.leave(**where, started=True)
                for event in run.absorb(*item):
                    yield event
        except Exception as exc:
            tail.append(run.fail(exc))
        finally:
            if waiting:
                local_queue.leave(**where, started=False)
            # Shielded: a second cancellation must not leave the request unbilled.
            await asyncio.shield(settlement_track(_finish(run, inbox, tail)))
    for event in tail:
        yield event


async def _finish(run: GenerationRun, inbox: asyncio.Queue, tail: list[Event]) -> None:
    if run.remaining:
        run.cancel()
        # The aborted sequences report their last outputs within a step; count them.
        deadline = time.monotonic() + DRAIN_SECONDS
        while run.remaining and time.monotonic() < deadline:
            try:
                index, item = await asyncio.wait_for(inbox.get(), deadline - time.monotonic())
            except TimeoutError:
                break
            _absorb_quietly(run, index, item)
    await asyncio.to_thread(run.settle, tail.append)


DRAIN_SECONDS = 5


def _drain(run: GenerationRun, get, empty: type[Exception]) -> None:
    """After an abort, take the sequences' last outputs (within a step) so usage counts every
    token they made."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while run.remaining and time.monotonic() < deadline:
        try:
            index, item = get(deadline - time.monotonic())
        except empty:
            break
        _absorb_quietly(run, index, item)


def _absorb_quietly(run: GenerationRun, index: int, item) -> None:
    if isinstance(item, BaseException):
        run.remaining -= 1
    else:
        run.absorb(index, item)
