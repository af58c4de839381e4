"""A request's run on a hosted engine: its sequences go in, their outputs come back as
events (workers/serving/events.py), and what ran is its usage. Where the outputs arrive is the
drivers' business (workers/run_loops.py)."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from tenants.errors import ApplicationError
from tenants.models import UsageRecord
from workers.engine import AsyncEngine, EngineError, RequestOutput
from workers.serving.events import Embedding, Event, Failed, Finish, Tokens, TokenUsage
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.serving.request_times import request_times_observe
from workers.serving.settlement import Emit, generation_settle
from workers.serving.trace import span_start
from workers.vllm import VllmEngine

logger = logging.getLogger(__name__)
Engine = AsyncEngine | VllmEngine  # the same interface: submit, abort, stats, shutdown
Sink = Callable[[RequestOutput | BaseException], None]


class Runs:
    """The runs of one engine host, by request id: a cancellation (the client went away, a
    cancel message from the API) finds the run wherever it is."""

    def __init__(self) -> None:
        self._runs: dict[str, EngineRun] = {}
        self._lock = threading.Lock()

    def add(self, run: EngineRun) -> None:
        with self._lock:
            self._runs[run.job.request_id] = run

    def remove(self, run: EngineRun) -> None:
        with self._lock:
            if self._runs.get(run.job.request_id) is run:
                del self._runs[run.job.request_id]

    def running(self) -> list[str]:
        """The request ids running here and not cancelled yet."""
        with self._lock:
            return [rid for rid, run in self._runs.items() if not run._is_cancelled.is_set()]

    def cancel(self, request_id: str) -> bool:
        """Abort a request running here; False if it does not run here."""
        with self._lock:
            run = self._runs.get(request_id)
        if run is None:
            return False
        run.cancel()
        return True


class EngineRun:
    """One request's run: submits its sequences and turns their outputs into events. How the
    outputs arrive (a thread's queue, an event loop's queue) is the caller's business; see
    `run_on_thread` and `run_on_loop`."""

    def __init__(
        self, job: Job, engine: Engine, *, backend: str, outbox: Outbox, runs: Runs
    ) -> None:
        self.job = job
        self.engine = engine
        self.backend = backend
        self.outbox, self.runs = outbox, runs
        self.info = job.model_info
        self.engine_ids: list[str] = []
        self.remaining = 0
        self.status = UsageRecord.Status.OK
        self.error: EngineError | ApplicationError | None = None
        self._is_cancelled = threading.Event()
        self._started = time.monotonic()
        self.num_output_tokens: dict[int, int] = {}
        self.num_cached_tokens: dict[int, int] = {}
        self.backlog: list[Event] = []  # events owed before any new output (on resume)

    def cancel(self) -> None:
        self._is_cancelled.set()
        for engine_id in self.engine_ids:
            self.engine.abort(engine_id)

    def __enter__(self) -> EngineRun:
        self.runs.add(self)
        self.span = span_start(
            "fairlane.generate",
            parent=self.job.trace,
            kind="consumer",
            request_id=self.job.request_id,
            model=self.info.name,
            backend=self.backend,
            lane=self.job.lane,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.runs.remove(self)
        timeline = self.job.timeline
        request_times_observe(
            timeline, model=self.info.name, output_tokens=sum(self.num_output_tokens.values())
        )
        self.span.set(
            prompt_tokens=sum(len(p) for p in self.job.prompts),
            completion_tokens=sum(self.num_output_tokens.values()),
            ttft_ms=int((timeline["first_token"] - timeline["taken"]) * 1000)
            if "first_token" in timeline and "taken" in timeline
            else None,
        )
        if self.error is not None:
            self.span.fail(self.error.message)
        self.span.end()

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
            if earlier and job.sampling and len(earlier) >= job.sampling.max_tokens:
                # it died before its "finish"
                self.backlog.append(Finish(choice=index, reason="length"))
                continue
            prompt = prompt + earlier
            engine_id = f"{job.request_id}:{index}"
            common: dict[str, Any] = {
                "request_id": engine_id,
                "tenant": str(job.tenant_id),
                "lane": job.lane,
            }
            if job.cache_salt:  # the engine's salt defaults to the tenant: keep it in front
                common["salt"] = f"{job.tenant_id}:{job.cache_salt}"
            if job.task == "embed":
                self.engine.submit(
                    prompt, None, sink_for(index), is_embedding=True, pooling="mean", **common
                )
            else:
                self.engine.submit(prompt, job.choice_params(index), sink_for(index), **common)
            self.engine_ids.append(engine_id)
            self.remaining += 1
            if self._is_cancelled.is_set():
                self.engine.abort(engine_id)
        if self.engine_ids:  # (a resumed request whose choices had all finished submits none)
            job.timeline["submitted"] = time.time()  # this worker's, as `taken` is

    def absorb(self, index: int, item: RequestOutput | BaseException) -> list[Event]:
        """The events one engine output makes; an engine failure raises."""
        if isinstance(item, BaseException):
            raise item
        self.num_output_tokens[index] = item.num_output_tokens + len(
            self.job.resumed.get(index, ())
        )
        if index not in self.job.resumed:  # a resumed prompt's cache hits are our own doing
            self.num_cached_tokens[index] = item.num_cached_tokens
        events: list[Event] = []
        if item.embedding is not None:
            events.append(Embedding(index=index, b64=_b64(item.embedding)))
        elif item.new_token_ids or item.new_text:
            events.append(_token_event(index, item))
            timeline = self.job.timeline
            timeline["last_token"] = now = time.time()
            timeline.setdefault("first_token", now)
        if item.finished:
            self.remaining -= 1
            if item.finish_reason == "abort":
                self.status = UsageRecord.Status.CANCELLED
            if self.job.task != "embed":
                events.append(Finish(choice=index, reason=item.finish_reason or "stop"))
        return events

    def fail(self, exc: BaseException) -> Failed:
        """Stop every sequence after a failure; the error event to send."""
        if isinstance(exc, ApplicationError):  # the stream's store failed (StreamLost)
            logger.warning("request %s stopped: %s", self.job.request_id, exc.message)
        elif not isinstance(exc, EngineError):  # a bug: log it with the request id
            logger.error("request %s failed", self.job.request_id, exc_info=exc)
            exc = EngineError("The engine failed while running this request.")
        self.status, self.error = UsageRecord.Status.ERROR, exc
        for engine_id in self.engine_ids:
            self.engine.abort(engine_id)
        return Failed(
            code=getattr(exc, "code", "internal_error"),
            message=exc.message,
            param=exc.param,
            retry_after=int(exc.retry_after)
            if isinstance(exc, ApplicationError) and exc.retry_after
            else None,
        )

    def settle(self, emit: Emit) -> None:
        """Charge what ran, once; emits `done`. Synchronous (database)."""
        usage = self.usage()
        if self.status == UsageRecord.Status.ERROR and not any(self.num_output_tokens.values()):
            # Nothing ran: the prompt was refused or the engine failed before computing it.
            usage = TokenUsage(completion_tokens=usage.completion_tokens)
        generation_settle(
            self.outbox,
            self.job,
            usage,
            status=self.status,
            backend=self.backend,
            emit=emit,
            latency_ms=int((time.monotonic() - self._started) * 1000),
        )

    def usage(self) -> TokenUsage:
        job = self.job
        prompt_tokens = sum(len(p) for p in job.prompts)
        # Copies of one prompt (n > 1) share its blocks; count each prompt's cache hits once.
        cached = sum(self.num_cached_tokens.get(p * job.n, 0) for p in range(len(job.prompts)))
        completion = sum(self.num_output_tokens.values()) if job.task != "embed" else 0
        return TokenUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            cached_tokens=min(cached, prompt_tokens),
        )


def _engine_weight_set(engine: Engine, tenant: str, weight: int) -> None:
    """The engine orders its waiting sequences by lane, then the tenant's virtual token
    counter divided by its weight: tell its policy the weight (a dict write, thread-safe)."""
    # A vLLM child has no such policy: the fair queue alone orders what it is given.
    weights = getattr(
        getattr(getattr(engine, "engine", None), "policy", None), "tenant_weights", None
    )
    if weights is not None:
        weights[tenant] = float(weight)


def _token_event(index: int, item: RequestOutput) -> Tokens:
    top = None
    if item.new_top_logprobs is not None:
        top = tuple({str(k): v for k, v in entry.items()} for entry in item.new_top_logprobs)
    return Tokens(
        choice=index,
        text=item.new_text,
        token_ids=tuple(item.new_token_ids),
        logprobs=None if item.new_logprobs is None else tuple(item.new_logprobs),
        top_logprobs=top,
    )


def _b64(vector: torch.Tensor) -> str:
    """Unit length, like OpenAI's embeddings (cosine similarity is then a dot product)."""
    unit = torch.nn.functional.normalize(vector.detach().to(torch.float32).cpu(), dim=-1)
    return base64.b64encode(unit.numpy().tobytes()).decode()
