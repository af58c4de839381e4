from celery import shared_task

from workers.artifacts.audit_signing import audit_checkpoint_sign


@shared_task(bind=True, name="workers.tasks.settlements_retry", ignore_result=True)
def settlements_retry(self) -> dict[str, int]:
    """Beat: settle what the outbox holds (records of processes that died before they could),
    with the worker process's runtime (platform/celery_app.py)."""
    return self.app.runtime.outbox.retry()


@shared_task(name="workers.tasks.audit_checkpoint", ignore_result=True)
def audit_checkpoint() -> int | None:
    """Beat: sign the audit log's chain heads with the platform's key (a checkpoint)."""
    checkpoint = audit_checkpoint_sign()
    return checkpoint.pk if checkpoint else None
