from celery import shared_task

from routing.batches.files import files_orphans_sweep as _files_orphans_sweep
from routing.health import backends_probe as _backends_probe
from routing.responses import store


@shared_task(bind=True, name="routing.tasks.backends_probe", ignore_result=True)
def backends_probe(self) -> dict[str, str]:
    """Beat: probe every backend's health (free requests only), with the worker process's
    runtime (platform/celery_app.py)."""
    return _backends_probe(pool=self.app.runtime.pool)


@shared_task(name="routing.tasks.stored_responses_expire", ignore_result=True)
def stored_responses_expire() -> int:
    """Beat, daily: stored responses past FAIRLANE_RESPONSES_RETENTION_DAYS go (they are
    already unreadable: every read skips an expired one)."""
    return store.stored_responses_expire()


@shared_task(name="routing.tasks.files_orphans_sweep", ignore_result=True)
def files_orphans_sweep() -> int:
    """Beat, daily: stored bytes no file row names, older than
    FAIRLANE_FILES_ORPHAN_GRACE_SECONDS, go (routing/batches/files.py)."""
    return _files_orphans_sweep()
