"""A threaded front for LLMEngine: one background thread runs ``step`` while callers stream.

Callers on an asyncio loop use ``generate`` (an async iterator of RequestOutput deltas); plain
threads (a Celery worker) use ``stream``. Requests are validated in the caller's thread, so bad
input raises there at once; everything that touches engine state runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import torch

from workers.engine.config import EngineConfig
from workers.engine.engine import LLMEngine
from workers.engine.errors import EngineError, EngineStopped, InvalidRequest
from workers.engine.outputs import RequestOutput
from workers.engine.params import SamplingParams
from workers.engine.policy import SchedulingPolicy
from workers.engine.sequence import Sequence

logger = logging.getLogger(__name__)
Sink = Callable[[RequestOutput | BaseException], None]


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._commands: list[Callable[[], object]] = []  # run on the loop thread; results unused
        self._sinks: dict[str, Sink] = {}
        self._thread: threading.Thread | None = None
        self._is_stopping = False
        self.error: BaseException | None = None

    @classmethod
    def from_config(
        cls, config: EngineConfig, *, policy: SchedulingPolicy | None = None
    ) -> AsyncEngine:
        return cls(LLMEngine(config, policy=policy))

    def start(self) -> AsyncEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; requests still in flight end with EngineStopped."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> AsyncEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._is_stopping

    @property
    def foreground_at(self) -> float:
        """When a sequence of a lane that does not yield last ran or waited here (monotonic
        seconds; 0.0: never, or no lane yields). Read from any thread."""
        return self.engine.scheduler.foreground_at

    # Submitting ---------------------------------------------------------------------------

    def submit(
        self, prompt: str | list[int], params: SamplingParams | None, sink: Sink, **kwargs: Any
    ) -> str:
        """Validate here, then hand the request to the loop; ``sink`` receives every delta."""
        seq = self.engine.make_sequence(prompt, params, **kwargs)
        with self._cond:
            if not self.is_running:
                raise EngineStopped("the engine loop is not running") from self.error
            if seq.request_id in self._sinks:
                raise InvalidRequest(
                    f"request {seq.request_id!r} is already running", param="request_id"
                )
            self._sinks[seq.request_id] = sink
            self._commands.append(lambda: self._add(seq))
            self._cond.notify()
        return seq.request_id

    def _add(self, seq: Sequence) -> None:
        try:
            self.engine.add_sequence(seq)
        except EngineError as exc:
            self._deliver(seq.request_id, exc, is_last=True)

    def abort(self, request_id: str) -> None:
        """Cancel a request (e.g. the client went away); its blocks are freed on the loop thread."""
        with self._cond:
            self._commands.append(lambda: self.engine.abort(request_id))
            self._cond.notify()

    async def generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, **kwargs: Any
    ) -> AsyncIterator[RequestOutput]:
        """Yield this request's deltas as the loop produces them; cancelling aborts it."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        request_id = self.submit(prompt, params, _async_sink(loop, inbox), **kwargs)
        is_done = False
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, BaseException):
                    is_done = True
                    raise item
                is_done = item.finished
                yield item
                if is_done:
                    return
        finally:
            if not is_done:
                self.abort(request_id)

    def stream(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Iterator[RequestOutput]:
        """Blocking iterator over this request's deltas, for threads without an event loop."""
        inbox: queue.Queue = queue.Queue()
        request_id = self.submit(prompt, params, inbox.put, **kwargs)
        is_done = False
        try:
            while not is_done:
                item = inbox.get(timeout=timeout)
                if isinstance(item, BaseException):
                    is_done = True
                    raise item
                is_done = item.finished
                yield item
        finally:
            if not is_done:
                self.abort(request_id)

    async def embed(
        self, prompt: str | list[int], *, pooling: str = "mean", **kwargs: Any
    ) -> torch.Tensor:
        """The pooled final hidden state of ``prompt``, [hidden_size]."""
        async for out in self.generate(prompt, None, is_embedding=True, pooling=pooling, **kwargs):
            if out.embedding is not None:
                return out.embedding
        raise EngineError("embedding request ended without a result")

    def stats(self) -> dict[str, Any]:
        """Engine counters, read between two steps."""
        return self._between_steps(self.engine.stats)

    def occupancy(self) -> dict[str, int]:
        """Whether the engine has room (its running and waiting sequences, its free and total
        KV blocks), read between two steps: the few counters a worker's puller needs each time
        it looks for work, not the whole of ``stats``."""
        return self._between_steps(self.engine.occupancy)

    def _between_steps(self, read_fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        done = threading.Event()
        box: dict[str, Any] = {}

        def read() -> None:
            box.update(read_fn())
            done.set()

        with self._cond:
            if not self.is_running:
                return read_fn()
            self._commands.append(read)
            self._cond.notify()
        done.wait()
        return box

    # The loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except Exception as exc:  # engine state is beyond repair: stop taking requests
            logger.exception("engine loop died")
            self.error = exc
            with self._cond:
                self._is_stopping = True
                sinks, self._sinks = self._sinks, {}
            for sink in sinks.values():
                _call(sink, EngineStopped(f"the engine loop died: {exc}"))

    def _loop_once(self) -> bool:
        with self._cond:
            while not (
                self._commands or self._is_stopping or self.engine.has_unfinished_requests()
            ):
                self._cond.wait()
            commands, self._commands = self._commands, []
            is_stopping = self._is_stopping
        for command in commands:
            command()
        if is_stopping:
            self._fail_all(EngineStopped("the engine is shutting down"))
            return False
        if self.engine.has_unfinished_requests():
            self._step()
        return True

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the loop is a process boundary: fail requests, keep serving
            logger.exception(
                "engine step failed; failing requests %s", sorted(self.engine.requests)
            )
            self._fail_all(EngineError(f"engine step failed: {exc}"))
            return
        for out in outputs:
            self._deliver(out.request_id, out, is_last=out.finished)

    def _fail_all(self, error: EngineError) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        self.engine.step_pending_clear()
        with self._cond:
            sinks, self._sinks = self._sinks, {}
        for sink in sinks.values():
            _call(sink, error)

    def _deliver(
        self, request_id: str, item: RequestOutput | BaseException, *, is_last: bool
    ) -> None:
        with self._cond:
            sink = self._sinks.pop(request_id, None) if is_last else self._sinks.get(request_id)
        if sink is not None and not _call(sink, item):
            self.engine.abort(request_id)  # nobody is listening any more


def _call(sink: Sink, item: RequestOutput | BaseException) -> bool:
    try:
        sink(item)
        return True
    except Exception:  # a closed event loop, or a caller's broken sink: never the engine's problem
        logger.warning("dropping output for a request whose consumer is gone", exc_info=True)
        return False


def _async_sink(loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> Sink:
    def sink(item: RequestOutput | BaseException) -> None:
        loop.call_soon_threadsafe(inbox.put_nowait, item)

    return sink
