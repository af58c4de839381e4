"""One request run on a hosted engine, wherever it runs (the embedded mode's thread pool or a
Celery GPU worker thread): submit its sequences, pass their tokens on as events, and settle
its budget reservation with what was actually generated, exactly once.

Events are plain dicts (they cross Redis as JSON), in this order:
  {"type": "accepted"}                                   the engine took every sequence
  {"type": "token", "choice", "text", "token_ids", "logprobs", "top_logprobs"}   repeated
  {"type": "finish", "choice", "reason"}                 per choice: stop | length | abort
  {"type": "embedding", "index", "b64"}                  embedding requests, per input
  {"type": "error", "code", "message", "param"}          something failed
  {"type": "done", "status", "usage": {...}}             always last; the ledger row exists
"""

from __future__ import annotations

import asyncio
import base64
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field

import torch

from tenants.models import UsageRecord
from tenants.services.settlement import Usage
from workers.engine import AsyncEngine, EngineError, RequestOutput, SamplingParams
from workers.fairqueue.local import local_queue
from workers.outbox import Settlement, settle_durably
from workers.registry import ModelInfo, usage_cost

logger = logging.getLogger(__name__)
Emit = Callable[[dict], None]
Sink = Callable[[RequestOutput | BaseException], None]


@dataclass(slots=True)
class GenerationJob:
    """Everything a worker needs to run and bill one request; JSON-serialisable."""

    request_id: str
    kind: str  # "generate" | "embed"
    model: dict  # ModelInfo.to_dict()
    prompts: list[list[int]]
    n: int = 1
    sampling: dict = field(default_factory=dict)  # SamplingParams keyword arguments
    tenant_id: int = 0
    agent_id: str = ""
    lane: str = "standard"
    weight: int = 1  # the tenant's fair-share weight
    cache_salt: str = ""  # the client's: prefix caches are shared within tenant and salt only
    created: float = field(default_factory=time.time)
    # Set when a request resumes on another worker: tokens each choice already streamed, and
    # the choices that already finished.
    resumed: dict[int, list[int]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GenerationJob:
        job = cls(**data)
        job.resumed = {int(k): v for k, v in job.resumed.items()}  # JSON keys are strings
        return job

    def resume_from(self, events: list[dict]) -> GenerationJob:
        """This job continued after the events an earlier run streamed: each unfinished
        choice goes on from its prompt plus the tokens it already produced, so the client
        gets the rest of its stream, not a second one."""
        resumed: dict[int, list[int]] = {}
        for event in events:
            if event["type"] == "token":
                resumed.setdefault(event["choice"], []).extend(event["token_ids"])
        finished = [e["choice"] for e in events if e["type"] == "finish"]
        return GenerationJob.from_dict({**self.to_dict(), "resumed": resumed,
                                        "finished": finished})

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(**self.model)

    def choice_params(self, index: int) -> SamplingParams:
        sampling = dict(self.sampling)
        # n choices of one prompt with one seed would be n identical answers.
        if sampling.get("seed") is not None:
            # Wrap within int64, the range seeds are accepted in.
            sampling["seed"] = (sampling["seed"] + index % self.n + 2**63) % 2**64 - 2**63
        done = len(self.resumed.get(index, ()))
        if done:
            sampling["max_tokens"] -= done
            sampling["min_tokens"] = max(sampling.get("min_tokens", 0) - done, 0)
        return SamplingParams(**sampling)


_settling: set[asyncio.Future] = set()


def settlement_track(awaitable) -> asyncio.Future:
    """Run a settlement as a task of its own (shield it: a second cancellation must not leave
    the request unbilled) that `settlements_finish` can wait for (a drain before exit)."""
    future = asyncio.ensure_future(awaitable)
    _settling.add(future)
    future.add_done_callback(_settling.discard)
    return future


async def settlements_finish(timeout: float) -> None:
    """Wait (up to `timeout` seconds) for the settlements this event loop has under way."""
    pending = [f for f in _settling if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout)


_running: dict[str, GenerationRun] = {}
_running_lock = threading.Lock()


def generation_cancel(request_id: str) -> bool:
    """Abort a request running in this process (the client went away); False if not here."""
    with _running_lock:
        run = _running.get(request_id)
    if run is None:
        return False
    run.cancel()
    return True


def running_request_ids() -> list[str]:
    with _running_lock:
        return list(_running)


class GenerationRun:
    """One request's run: submits its sequences and turns their outputs into events. How the
    outputs arrive (a thread's queue, an event loop's queue) is the caller's business; see
    `generation_run_blocking` and `generation_run_async`."""

    def __init__(self, job: GenerationJob, engine: AsyncEngine, *, backend: str) -> None:
        self.job = job
        self.engine = engine
        self.backend = backend
        self.info = job.model_info
        self.engine_ids: list[str] = []
        self.remaining = 0
        self.status = UsageRecord.Status.OK
        self.error: EngineError | None = None
        self._is_cancelled = threading.Event()
        self._started = time.monotonic()
        self.num_output_tokens: dict[int, int] = {}
        self.num_cached_tokens: dict[int, int] = {}
        self.backlog: list[dict] = []  # events owed before any new output (on resume)

    def cancel(self) -> None:
        self._is_cancelled.set()
        for engine_id in self.engine_ids:
            self.engine.abort(engine_id)

    def __enter__(self) -> GenerationRun:
        with _running_lock:
            _running[self.job.request_id] = self
        return self

    def __exit__(self, *exc: object) -> None:
        with _running_lock:
            _running.pop(self.job.request_id, None)

    def submit(self, sink_for: Callable[[int], Sink]) -> None:
        """Hand every choice's sequence to the engine; its outputs go to `sink_for(index)`."""
        job = self.job
        choices = [prompt for prompt in job.prompts for _ in range(job.n)]
        _engine_weight_set(self.engine, str(job.tenant_id), job.weight)
        for index, prompt in enumerate(choices):
            earlier = job.resumed.get(index, [])
            self.num_output_tokens[index] = len(earlier)
            if index in job.finished:
                continue
            if earlier and len(earlier) >= job.sampling["max_tokens"]:  # died before "finish"
                self.backlog.append({"type": "finish", "choice": index, "reason": "length"})
                continue
            prompt = prompt + earlier
            engine_id = f"{job.request_id}:{index}"
            common = {"request_id": engine_id, "tenant": str(job.tenant_id), "lane": job.lane}
            if job.cache_salt:  # the engine's salt defaults to the tenant: keep it in front
                common["salt"] = f"{job.tenant_id}:{job.cache_salt}"
            if job.kind == "embed":
                self.engine.submit(prompt, None, sink_for(index), is_embedding=True,
                                   pooling="mean", **common)
            else:
                self.engine.submit(prompt, job.choice_params(index), sink_for(index), **common)
            self.engine_ids.append(engine_id)
            self.remaining += 1
            if self._is_cancelled.is_set():
                self.engine.abort(engine_id)

    def absorb(self, index: int, item: RequestOutput | BaseException) -> list[dict]:
        """The events one engine output makes; an engine failure raises."""
        if isinstance(item, BaseException):
            raise item
        self.num_output_tokens[index] = item.num_output_tokens + len(
            self.job.resumed.get(index, ()))
        if index not in self.job.resumed:  # a resumed prompt's cache hits are our own doing
            self.num_cached_tokens[index] = item.num_cached_tokens
        events = []
        if item.embedding is not None:
            events.append({"type": "embedding", "index": index, "b64": _b64(item.embedding)})
        elif item.new_token_ids or item.new_text:
            events.append(_token_event(index, item))
        if item.finished:
            self.remaining -= 1
            if item.finish_reason == "abort":
                self.status = UsageRecord.Status.CANCELLED
            if self.job.kind != "embed":
                events.append({"type": "finish", "choice": index, "reason": item.finish_reason})
        return events

    def fail(self, exc: BaseException) -> dict:
        """Stop every sequence after a failure; the error event to send."""
        if not isinstance(exc, EngineError):  # a bug: log it with the request id
            logger.error("request %s failed", self.job.request_id, exc_info=exc)
            exc = EngineError("The engine failed while running this request.")
        self.status, self.error = UsageRecord.Status.ERROR, exc
        for engine_id in self.engine_ids:
            self.engine.abort(engine_id)
        return {"type": "error", "code": getattr(exc, "code", "internal_error"),
                "message": exc.message, "param": exc.param}

    def settle(self, emit: Emit) -> None:
        """Charge what ran, once; emits `done`. Synchronous (database)."""
        usage = self.usage()
        if self.status == UsageRecord.Status.ERROR and not any(self.num_output_tokens.values()):
            # Nothing ran: the prompt was refused or the engine failed before computing it.
            usage.update(prompt_tokens=0, total_tokens=0, cached_tokens=0)
        generation_settle(self.job, usage, status=self.status, backend=self.backend,
                          latency_ms=int((time.monotonic() - self._started) * 1000), emit=emit)

    def usage(self) -> dict:
        job = self.job
        prompt_tokens = sum(len(p) for p in job.prompts)
        # Copies of one prompt (n > 1) share its blocks; count each prompt's cache hits once.
        cached = sum(self.num_cached_tokens.get(p * job.n, 0) for p in range(len(job.prompts)))
        completion = sum(self.num_output_tokens.values()) if job.kind != "embed" else 0
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "cached_tokens": min(cached, prompt_tokens)}


class LostOwnership(Exception):
    """Another worker took this request over (this one's lease lapsed): stop at once, and
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
            for event in [{"type": "accepted"}, *run.backlog]:
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


def _emit_quietly(emit: Emit, event: dict) -> None:
    """An event nobody may be able to receive any more (the stream's store failed)."""
    try:
        emit(event)
    except Exception as exc:
        logger.warning("could not send a %s event: %s: %s", event["type"], type(exc).__name__,
                       exc)


async def generation_run_async(job: GenerationJob, engine: AsyncEngine, *,
                               backend: str) -> AsyncIterator[dict]:
    """Run a request with its outputs arriving on this event loop (the embedded mode: no
    thread per request). Closing the iterator early (the client left) aborts the run; it is
    settled, with every token it made, either way."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    run = GenerationRun(job, engine, backend=backend)
    tail: list[dict] = []
    where = {"model": job.model["name"], "lane": job.lane, "tenant": str(job.tenant_id)}
    waiting = False
    with run:
        try:
            run.submit(lambda index: lambda item: loop.call_soon_threadsafe(
                inbox.put_nowait, (index, item)))
            local_queue.enter(**where)  # admission counts it until its first output
            waiting = True
            for event in [{"type": "accepted"}, *run.backlog]:
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


async def _finish(run: GenerationRun, inbox: asyncio.Queue, tail: list[dict]) -> None:
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


def generation_settle(job: GenerationJob, usage: dict, *, status: str, backend: str,
                      latency_ms: int, emit: Emit, cost_microcents: int | None = None) -> None:
    """Charge the request's usage once (idempotent per request id), then emit `done`. The
    cost is the model's prices applied to the usage unless the backend reported its own. When
    the ledger is unreachable the charge is queued durably (workers/outbox.py) and `done`
    still says what it will be."""
    info = job.model_info
    cost = cost_microcents if cost_microcents is not None else usage_cost(
        info, prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"],
        cached_tokens=usage["cached_tokens"])
    settle_durably(Settlement(
        request_id=job.request_id, tenant_id=job.tenant_id, cost_microcents=cost, at=time.time(),
        usage=asdict(Usage(backend=backend, model=info.name,
                           prompt_tokens=usage["prompt_tokens"],
                           completion_tokens=usage["completion_tokens"],
                           cached_tokens=usage["cached_tokens"], latency_ms=latency_ms,
                           status=status))))
    emit({"type": "done", "status": status, "usage": {**usage, "cost_microcents": cost}})


def _engine_weight_set(engine: AsyncEngine, tenant: str, weight: int) -> None:
    """The engine orders its waiting sequences by lane, then the tenant's virtual token
    counter divided by its weight: tell its policy the weight (a dict write, thread-safe)."""
    weights = getattr(engine.engine.policy, "tenant_weights", None)
    if weights is not None:
        weights[tenant] = float(weight)


def generation_settle_partial(job: GenerationJob, events: list[dict], *, backend: str,
                              emit: Emit) -> None:
    """A run the API gave up on (its worker went silent): end the stream with an error and
    charge exactly the tokens it sent. Settlement is idempotent, so a worker that finishes it
    later cannot charge again."""
    if any(e["type"] == "done" for e in events):
        return
    completion = sum(len(e.get("token_ids") or ()) for e in events if e["type"] == "token")
    prompt = sum(len(p) for p in job.prompts) if events else 0
    emit({"type": "error", "code": "backend_unavailable",
          "message": "The worker running this request stopped.", "param": None})
    generation_settle(job, {"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion, "cached_tokens": 0},
                      status=UsageRecord.Status.ERROR, backend=backend, latency_ms=0, emit=emit)


def _token_event(index: int, item: RequestOutput) -> dict:
    top = None
    if item.new_top_logprobs is not None:
        top = [{str(k): v for k, v in entry.items()} for entry in item.new_top_logprobs]
    return {"type": "token", "choice": index, "text": item.new_text,
            "token_ids": list(item.new_token_ids), "logprobs": item.new_logprobs,
            "top_logprobs": top}


def _b64(vector: torch.Tensor) -> str:
    """Unit length, like OpenAI's embeddings (cosine similarity is then a dot product)."""
    unit = torch.nn.functional.normalize(vector.detach().to(torch.float32).cpu(), dim=-1)
    return base64.b64encode(unit.numpy().tobytes()).decode()
