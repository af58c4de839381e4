"""The batch runner: a background loop (tenants/loops.py) in each API process, in both modes,
that takes batches through their states and runs their lines as ordinary requests of the
batch's agent: admitted against its budget, on the bulk lane (so the fair queue, the lane's
weight and the brownout keep interactive traffic first), at the batch price, metered in the
ledger under the line's request id. A runner has at most FAIRLANE_BATCH_IN_FLIGHT lines of a
batch in flight, so a batch is never enqueued whole; runners in several processes share a
batch through the lines' claims (routing/batches/lines.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from routing import services
from routing.admission import Caller
from routing.batch_models import Batch, BatchLine, BatchStatus
from routing.batches import lines as steps
from routing.batches import services as batches
from routing.batches.endpoints import ENDPOINTS
from routing.responses.services import response_collect, response_start
from routing.sync import db_call
from tenants.errors import ApplicationError, BudgetExhausted, error_body_for
from tenants.loops import BackgroundLoop
from tenants.models import Reservation, UsageRecord
from tenants.services.budgets import budget_release
from workers.serving.runtime import Runtime

logger = logging.getLogger(__name__)
# Refusals that pass (a full queue, a brownout, a rate limit, no backend now): the line
# waits for a later round rather than failing.
RETRY_CODES = {
    "overloaded",
    "rate_limited",
    "backend_unavailable",
    "circuit_open",
    "service_unavailable",
    "timeout",
}


# How recent an interactive request on this process's engines makes the runner give way.
INTERACTIVE_RECENT_SECONDS = 0.5


class _Retry(Exception):
    pass


def _run_state(line: BatchLine, batch: Batch) -> str:
    """Whether the line may start a run: "run"; "wait" while an earlier run may still be
    charged (its reservation is held); "lost" when an earlier run was charged but its answer
    did not reach the batch (its process stopped in between). A hold past its expiry belongs
    to a run whose process died: it is released through the budgets' own service, so no late
    settlement can charge it, and the line runs again."""
    if line.attempts == 0:
        return "run"
    request_id = line.request_id
    if UsageRecord.objects.filter(request_id=request_id).exists():
        return "lost"
    held = Reservation.objects.filter(request_id=request_id, status=Reservation.Status.HELD).first()
    if held is None:
        return "run"
    if held.expires_at < timezone.now():
        budget_release(
            tenant=batch.tenant, request_id=request_id, status=Reservation.Status.EXPIRED
        )
        return "lost" if UsageRecord.objects.filter(request_id=request_id).exists() else "run"
    return "wait"


def _charged(request_id: str) -> bool:
    return UsageRecord.objects.filter(request_id=request_id).exists()


def _line_started(line: BatchLine, batch: Batch) -> str:
    """Check the line's earlier run, then count a new attempt (before it runs: a run that
    dies is never started again under the same request id)."""
    state = _run_state(line, batch)
    if state == "run":
        line.attempts += 1
        BatchLine.objects.filter(pk=line.pk).update(attempts=line.attempts)
    return state


async def _line_call(runtime: Runtime, caller: Caller, kind: str, body: dict) -> dict[str, Any]:
    if kind == "embedding":
        return await services.embeddings_create(runtime=runtime, caller=caller, body=body)
    if kind == "responses":
        response = await response_start(runtime=runtime, caller=caller, body=body)
        return await response_collect(response)
    started = await services.generation_start(
        runtime=runtime, caller=caller, endpoint=kind, body=body
    )
    return await services.started_collect(started)


class BatchRunner:
    """Advances every batch not at rest, a round per step."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.loop = BackgroundLoop(
            "batch-runner", self._step, interval=lambda: settings.FAIRLANE_BATCH_POLL_SECONDS
        )
        self._events: asyncio.AbstractEventLoop | None = None

    def _step(self) -> float | None:
        if self._events is None:
            self._events = asyncio.new_event_loop()
        busy = self._events.run_until_complete(self.round())
        return 0.0 if busy else None

    async def round(self) -> bool:
        """One round over the active batches (concurrently, so two tenants' batches share the
        queue fairly); whether any had lines to run."""
        ids = await db_call(batches.batches_active)()
        results = await asyncio.gather(*(self.advance(i) for i in ids), return_exceptions=True)
        for batch_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("batch %s: a round failed", batch_id, exc_info=result)
        return any(r is True for r in results)

    async def advance(self, batch_id: str) -> bool:
        batch = await db_call(Batch.objects.select_related("tenant", "agent", "api_key").get)(
            pk=batch_id
        )
        if batch.status == BatchStatus.VALIDATING:
            await db_call(steps.batch_validate)(batch=batch)
            return True
        closing: tuple[str, str, str] | None = {
            str(BatchStatus.CANCELLING): (
                BatchStatus.CANCELLED,
                "batch_cancelled",
                "The batch was cancelled before this line ran.",
            ),
        }.get(batch.status)
        if batch.status == BatchStatus.IN_PROGRESS and timezone.now() >= batch.expires_at:
            closing = (
                BatchStatus.EXPIRED,
                "batch_expired",
                "The batch's completion window ended before this line ran.",
            )
        if closing is not None or batch.status == BatchStatus.FINALIZING:
            final, code, message = closing or (BatchStatus.COMPLETED, "", "")
            if code:
                await db_call(steps.lines_close)(batch=batch, code=code, message=message)
            if await db_call(steps.lines_open)(batch=batch) == 0:
                await db_call(steps.batch_finalize)(batch=batch, status=final)
            return False
        count, yielding = self.line_room()
        lines = await db_call(steps.lines_claim)(batch=batch, count=count)
        if not lines:
            if await db_call(steps.lines_open)(batch=batch) == 0:
                await db_call(
                    Batch.objects.filter(pk=batch.pk, status=BatchStatus.IN_PROGRESS).update
                )(status=BatchStatus.FINALIZING, finalizing_at=timezone.now())
            return False
        if batch.api_key is None:  # its key was deleted: the batch can run no more lines
            for line in lines:
                await db_call(steps.line_release)(line=line)
            await db_call(steps.lines_close)(
                batch=batch, code="api_key_deleted", message="The batch's API key was deleted."
            )
            return False
        caller_base = Caller(
            api_key=batch.api_key, tenant=batch.tenant, agent=batch.agent, batch_id=batch.id
        )
        outcomes = await asyncio.gather(
            *(self.line_run(batch, caller_base, line) for line in lines), return_exceptions=True
        )
        answered = False
        for line, outcome in zip(lines, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.error("batch %s line %s failed", batch.id, line.index, exc_info=outcome)
                await db_call(steps.line_release)(line=line)
            answered = answered or outcome is True
        # Lines only put back (a full queue), or interactive requests on this process's
        # engines: wait before the next round.
        return answered and not yielding

    def line_room(self) -> tuple[int, bool]:
        """How many lines a batch may start this round, and whether the runner is giving way:
        one, while this process's engines ran an interactive request in the last
        INTERACTIVE_RECENT_SECONDS (in the embedded mode the runner's own work, admitting,
        settling and recording each line, takes the cores those requests run on), else
        FAIRLANE_BATCH_IN_FLIGHT. A runner beside no engine (the distributed mode) never
        gives way here: the fair queue and the workers' engines keep bulk behind."""
        host = self.runtime.engine_host
        if (
            host is not None
            and time.monotonic() - host.foreground_at() < INTERACTIVE_RECENT_SECONDS
        ):
            return 1, True
        return settings.FAIRLANE_BATCH_IN_FLIGHT, False

    async def line_run(self, batch: Batch, base: Caller, line: BatchLine) -> bool:
        """Run one line and record its answer; False when it was put back for later."""
        state = await db_call(_line_started)(line, batch)
        if state == "wait":
            await db_call(steps.line_release)(line=line)
            return False
        if state == "lost":
            await db_call(steps.line_answer)(
                line=line,
                error={
                    "code": "answer_lost",
                    "message": "The line ran and was charged, but "
                    "its answer was lost when the process running it stopped.",
                },
            )
            return True
        caller = Caller(
            api_key=base.api_key,
            tenant=base.tenant,
            agent=base.agent,
            batch_id=base.batch_id,
            request_id=line.request_id,
        )
        kind = ENDPOINTS[batch.endpoint].kind
        try:
            body = await _line_call(self.runtime, caller, kind, json.loads(line.body))
        except BudgetExhausted as exc:
            await db_call(steps.line_answer)(
                line=line, error={"code": exc.code, "message": exc.message}
            )
            await db_call(steps.lines_close)(batch=batch, code=exc.code, message=exc.message)
            return True
        except ApplicationError as exc:
            # A refusal that passes is tried again, unless this run was charged already (it
            # failed after it started): then its error is its answer.
            if exc.code in RETRY_CODES and not await db_call(_charged)(line.request_id):
                await db_call(steps.line_release)(line=line)
                return False
            await db_call(steps.line_answer)(
                line=line, status_code=exc.status, response=error_body_for(exc)
            )
            return True
        await db_call(steps.line_answer)(line=line, status_code=200, response=body)
        return True


def batch_runner_start(runtime: Runtime) -> BatchRunner | None:
    """The API process's runner (FAIRLANE_BATCH_RUNNER), added to the runtime's loops so it
    stops with them."""
    if not settings.FAIRLANE_BATCH_RUNNER:
        return None
    runner = BatchRunner(runtime)
    runtime.loops.add(runner.loop).start()
    return runner
