"""The one settlement service: a request's run charged once (idempotent per request id), then
`Done` sent; a run given up on charged for what it streamed; a hold never served released. All
of them are durable (workers/serving/outbox.py). And the settlements this event loop has under way,
which a drain waits for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from tenants.models import UsageRecord
from tenants.services.ledger import Usage
from workers.serving.catalog import usage_cost
from workers.serving.events import Done, Event, Failed, Tokens, TokenUsage
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox, Settlement
from workers.serving.trace import span_start, trace_id_of
from workers.serving.versions import version_tag

Emit = Callable[[Event], None]

_settling: set[asyncio.Future[None]] = set()


def settlement_track(awaitable: Awaitable[None]) -> asyncio.Future[None]:
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


def generation_settle(
    outbox: Outbox,
    job: Job,
    usage: TokenUsage,
    *,
    status: str,
    backend: str,
    latency_ms: int,
    emit: Emit,
    cost_microcents: int | None = None,
) -> None:
    """Charge the request's usage once (idempotent per request id), then emit `Done`. The
    cost is the model's prices applied to the usage unless the backend reported its own. When
    the ledger is unreachable the charge is queued durably (workers/serving/outbox.py) and `Done`
    still says what it will be."""
    info = job.model_info
    cost = (
        cost_microcents
        if cost_microcents is not None
        else usage_cost(
            info,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
        )
    )
    span = span_start(
        "fairlane.settle",
        parent=job.trace,
        request_id=job.request_id,
        cost_microcents=cost,
        status=status,
    )
    outbox.settle(
        Settlement(
            request_id=job.request_id,
            tenant_id=job.tenant_id,
            cost_microcents=cost,
            at=time.time(),
            usage=asdict(
                Usage(
                    backend=backend,
                    model=info.name,
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    cached_tokens=usage.cached_tokens,
                    latency_ms=latency_ms,
                    status=status,
                    trace_id=trace_id_of(job.trace),
                    model_version=version_tag(job.model),
                    timeline=job.timeline,
                )
            ),
        )
    )
    span.end()
    emit(Done(status=status, usage=usage, cost_microcents=cost))


def generation_settle_partial(
    outbox: Outbox, job: Job, events: list[Event], *, backend: str, emit: Emit
) -> None:
    """A run the API gave up on (its worker went silent): end the stream with an error and
    charge exactly the tokens it sent. Settlement is idempotent, so a worker that finishes it
    later cannot charge again."""
    if any(isinstance(e, Done) for e in events):
        return
    completion = sum(len(e.token_ids) for e in events if isinstance(e, Tokens))
    prompt = sum(len(p) for p in job.prompts) if events else 0
    emit(Failed(code="backend_unavailable", message="The worker running this request stopped."))
    generation_settle(
        outbox,
        job,
        TokenUsage(prompt_tokens=prompt, completion_tokens=completion),
        status=UsageRecord.Status.ERROR,
        backend=backend,
        latency_ms=0,
        emit=emit,
    )


def settlement_release(outbox: Outbox, *, request_id: str, tenant_id: int) -> None:
    """Free the hold of a request no backend served. Durable like a charge: when the database
    does not answer, the release waits in the outbox, so no hold outlives its request."""
    outbox.settle(
        Settlement(
            request_id=request_id,
            tenant_id=tenant_id,
            cost_microcents=0,
            usage={},
            at=time.time(),
            release=True,
        )
    )
