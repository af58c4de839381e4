"""Celery tasks of the GPU pool. Thin: parse the job, decide whether it may run, run it."""

import logging

from celery import shared_task

from tenants.models import UsageRecord
from workers import worker
from workers.generation import GenerationJob, generation_run_blocking, generation_settle
from workers.host import host_get
from workers.transport import RedisStreamEmit, is_cancel_requested, redis_sync

logger = logging.getLogger(__name__)
_client = None


def _redis():
    global _client
    if _client is None:
        _client = redis_sync()
    return _client


@shared_task(name="workers.generate", acks_late=True, reject_on_worker_lost=True,
             ignore_result=True)
def generate(job: dict) -> None:
    """Run one request on this worker's engine, streaming its events to Redis. Acked when it
    ends, so a worker lost mid-way gets the task delivered again, and the guards below make the
    redelivery finish the request once instead of running it twice."""
    job = GenerationJob.from_dict(job)
    client = _redis()
    emit = RedisStreamEmit(client, job.request_id)
    backend = f"worker:{worker.WORKER_ID}"
    if not worker.run_lock_take(client, job.request_id):
        return  # a live worker runs it: this is a duplicate delivery
    try:
        earlier = emit.existing()
        if any(event["type"] == "done" for event in earlier):
            return  # it finished; only the acknowledgement was lost
        if earlier:
            job = job.resume_from(earlier)  # the client has these tokens: continue after them
        if is_cancel_requested(client, job.request_id):
            generation_settle(job, {"prompt_tokens": 0, "completion_tokens": 0,
                                    "total_tokens": 0, "cached_tokens": 0},
                              status=UsageRecord.Status.CANCELLED, backend=backend,
                              latency_ms=0, emit=emit)
            return
        engine = host_get().engine(job.model_info)
        generation_run_blocking(job, engine, emit, backend=backend)
    finally:
        client.delete(worker.run_lock_key(job.request_id))
