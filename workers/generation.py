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

import base64
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from django.db import close_old_connections

from tenants.models import Tenant, UsageRecord
from tenants.services.budgets import Usage, budget_settle
from workers.engine import AsyncEngine, EngineError, RequestOutput, SamplingParams
from workers.registry import ModelInfo, usage_cost

logger = logging.getLogger(__name__)
Emit = Callable[[dict], None]


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
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GenerationJob:
        return cls(**data)

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(**self.model)

    def choice_params(self, index: int) -> SamplingParams:
        sampling = dict(self.sampling)
        # n choices of one prompt with one seed would be n identical answers.
        if sampling.get("seed") is not None:
            sampling["seed"] = (sampling["seed"] + index % self.n) % (2**63)
        return SamplingParams(**sampling)


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
    def __init__(self, job: GenerationJob, engine: AsyncEngine, emit: Emit, *, backend: str):
        self.job = job
        self.engine = engine
        self.emit = emit
        self.backend = backend
        self.info = job.model_info
        self._inbox: queue.Queue = queue.Queue()
        self._engine_ids: list[str] = []
        self._is_cancelled = threading.Event()
        self._started = time.monotonic()
        self.num_output_tokens: dict[int, int] = {}
        self.num_cached_tokens: dict[int, int] = {}

    def cancel(self) -> None:
        self._is_cancelled.set()
        for engine_id in self._engine_ids:
            self.engine.abort(engine_id)

    def run(self) -> None:
        """Run to the end and settle; never raises (a worker thread is a process boundary)."""
        with _running_lock:
            _running[self.job.request_id] = self
        status, error = UsageRecord.Status.OK, None
        try:
            self._submit()
            self.emit({"type": "accepted"})
            status = self._collect()
        except EngineError as exc:
            status, error = UsageRecord.Status.ERROR, exc
        except Exception as exc:  # a bug: log it with the request id, bill what ran
            logger.exception("request %s failed", self.job.request_id)
            status, error = UsageRecord.Status.ERROR, EngineError(f"internal error: {exc}")
        finally:
            with _running_lock:
                _running.pop(self.job.request_id, None)
        if error is not None:
            for engine_id in self._engine_ids:
                self.engine.abort(engine_id)
            self.emit({"type": "error", "code": getattr(error, "code", "internal_error"),
                       "message": error.message, "param": error.param})
        self._settle(status)

    def _submit(self) -> None:
        job = self.job
        choices = [(i, prompt) for i, prompt in enumerate(job.prompts) for _ in range(job.n)]
        for index, (_, prompt) in enumerate(choices):
            engine_id = f"{job.request_id}:{index}"
            sink = _tagged_sink(self._inbox, index)
            common = {"request_id": engine_id, "tenant": str(job.tenant_id), "lane": job.lane}
            if job.kind == "embed":
                self.engine.submit(prompt, None, sink, is_embedding=True, pooling="mean", **common)
            else:
                self.engine.submit(prompt, job.choice_params(index), sink, **common)
            self._engine_ids.append(engine_id)
            if self._is_cancelled.is_set():
                self.engine.abort(engine_id)

    def _collect(self) -> str:
        remaining = len(self._engine_ids)
        status = UsageRecord.Status.OK
        while remaining:
            index, item = self._inbox.get()
            if isinstance(item, BaseException):
                raise item
            self.num_output_tokens[index] = item.num_output_tokens
            self.num_cached_tokens[index] = item.num_cached_tokens
            if item.embedding is not None:
                self.emit({"type": "embedding", "index": index, "b64": _b64(item.embedding)})
            elif item.new_token_ids or item.new_text:
                self.emit(_token_event(index, item))
            if item.finished:
                remaining -= 1
                if item.finish_reason == "abort":
                    status = UsageRecord.Status.CANCELLED
                if self.job.kind != "embed":
                    self.emit({"type": "finish", "choice": index, "reason": item.finish_reason})
        return status

    def usage(self) -> dict:
        job = self.job
        prompt_tokens = sum(len(p) for p in job.prompts)
        # Copies of one prompt (n > 1) share its blocks; count each prompt's cache hits once.
        cached = sum(self.num_cached_tokens.get(p * job.n, 0) for p in range(len(job.prompts)))
        completion = sum(self.num_output_tokens.values()) if job.kind != "embed" else 0
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion, "cached_tokens": min(cached,
                                                                                 prompt_tokens)}

    def _settle(self, status: str) -> None:
        usage = self.usage()
        if status == UsageRecord.Status.ERROR and not any(self.num_output_tokens.values()):
            # Nothing ran: the prompt was refused or the engine failed before computing it.
            usage.update(prompt_tokens=0, total_tokens=0, cached_tokens=0)
        generation_settle(self.job, usage, status=status, backend=self.backend,
                          latency_ms=int((time.monotonic() - self._started) * 1000),
                          emit=self.emit)


def generation_settle(job: GenerationJob, usage: dict, *, status: str, backend: str,
                      latency_ms: int, emit: Emit) -> None:
    """Charge the request's usage once (idempotent per request id), then emit `done`."""
    info = job.model_info
    cost = usage_cost(info, prompt_tokens=usage["prompt_tokens"],
                      completion_tokens=usage["completion_tokens"],
                      cached_tokens=usage["cached_tokens"])
    try:
        budget_settle(
            tenant=Tenant(pk=job.tenant_id), request_id=job.request_id, cost_microcents=cost,
            usage=Usage(backend=backend, model=info.name, prompt_tokens=usage["prompt_tokens"],
                        completion_tokens=usage["completion_tokens"],
                        cached_tokens=usage["cached_tokens"], latency_ms=latency_ms,
                        status=status),
        )
    except Exception:  # the ledger is down: the reservation expires; say so loudly
        logger.exception("request %s: settlement failed", job.request_id)
    finally:
        close_old_connections()
    emit({"type": "done", "status": status, "usage": {**usage, "cost_microcents": cost}})


def generation_settle_partial(job: GenerationJob, events: list[dict], *, backend: str,
                              emit: Emit) -> None:
    """A run that stopped without settling (its worker died after streaming some tokens):
    end the stream with an error and charge exactly the tokens it sent, never re-running it,
    because the client already has those tokens."""
    if any(e["type"] == "done" for e in events):
        return
    completion = sum(len(e.get("token_ids") or ()) for e in events if e["type"] == "token")
    prompt = sum(len(p) for p in job.prompts) if events else 0
    emit({"type": "error", "code": "backend_unavailable",
          "message": "The worker running this request stopped.", "param": None})
    generation_settle(job, {"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion, "cached_tokens": 0},
                      status=UsageRecord.Status.ERROR, backend=backend, latency_ms=0, emit=emit)


def _tagged_sink(inbox: queue.Queue, index: int) -> Callable[[RequestOutput | BaseException], None]:
    def sink(item: RequestOutput | BaseException) -> None:
        inbox.put((index, item))
    return sink


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
