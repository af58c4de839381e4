"""One request run on a hosted engine, wherever it runs (the embedded mode's thread pool or a
Celery GPU worker thread): submit its sequences, pass their outputs on as events
(workers/serving/events.py), and settle its budget reservation with what was actually generated,
exactly once (workers/serving/settlement.py). The run itself, outputs to events, is workers/runs.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import AsyncIterator, Callable

from workers.engine import RequestOutput
from workers.fairqueue.local import LocalQueue
from workers.runs import Engine, EngineRun, Runs, Sink
from workers.serving.events import Accepted, Event
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.serving.settlement import Emit, settlement_track
from workers.transport import LostOwnership

logger = logging.getLogger(__name__)


# What an engine hands the loop: a choice's output, or the exception that ended it.
Inbox = asyncio.Queue[tuple[int, RequestOutput | BaseException]]


def run_on_thread(
    job: Job, engine: Engine, emit: Emit, *, backend: str, outbox: Outbox, runs: Runs
) -> None:
    """Run a request on this thread (a GPU worker's task) and settle it. Raises only
    LostOwnership (nothing settled then); an emit that fails otherwise (Redis went away)
    stops the run, which is still settled. A worker thread is a process boundary."""
    inbox: queue.Queue[tuple[int, RequestOutput | BaseException]] = queue.Queue()
    with EngineRun(job, engine, backend=backend, outbox=outbox, runs=runs) as run:
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
        logger.warning(
            "could not send a %s event: %s: %s", type(event).__name__, type(exc).__name__, exc
        )


async def run_on_loop(
    job: Job,
    engine: Engine,
    *,
    backend: str,
    outbox: Outbox,
    runs: Runs,
    local_queue: LocalQueue,
) -> AsyncIterator[Event]:
    """Run a request with its outputs arriving on this event loop (the embedded mode: no
    thread per request). Closing the iterator early (the client left) aborts the run; it is
    settled, with every token it made, either way."""
    loop = asyncio.get_running_loop()
    inbox: Inbox = asyncio.Queue()
    run = EngineRun(job, engine, backend=backend, outbox=outbox, runs=runs)
    tail: list[Event] = []
    where = {"model": job.model["name"], "lane": job.lane, "tenant": str(job.tenant_id)}
    waiting = False
    with run:
        try:
            # No fair queue here: the engine takes it at once (its own scheduler orders what
            # it has by lane and tenant).
            job.timeline.update(taken=time.time(), worker=backend, lane=job.lane)

            def sink_for(index: int) -> Sink:
                def sink(item: RequestOutput | BaseException) -> None:
                    loop.call_soon_threadsafe(inbox.put_nowait, (index, item))

                return sink

            run.submit(sink_for)
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


async def _finish(run: EngineRun, inbox: Inbox, tail: list[Event]) -> None:
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


def _drain(
    run: EngineRun,
    get: Callable[[float], tuple[int, RequestOutput | BaseException]],
    empty: type[Exception],
) -> None:
    """After an abort, take the sequences' last outputs (within a step) so usage counts every
    token they made."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while run.remaining and time.monotonic() < deadline:
        try:
            index, item = get(deadline - time.monotonic())
        except empty:
            break
        _absorb_quietly(run, index, item)


def _absorb_quietly(run: EngineRun, index: int, item: RequestOutput | BaseException) -> None:
    if isinstance(item, BaseException):
        run.remaining -= 1
    else:
        run.absorb(index, item)
