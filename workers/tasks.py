from celery import shared_task

from workers.outbox import settlements_drain as _drain


@shared_task(name="workers.tasks.settlements_drain", ignore_result=True)
def settlements_drain() -> dict[str, int]:
    """Beat: settle what the outbox holds (records of processes that died before they could)."""
    return _drain()
