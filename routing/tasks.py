from celery import shared_task

from routing.health import backends_probe as _backends_probe


@shared_task(name="routing.tasks.backends_probe", ignore_result=True)
def backends_probe() -> dict[str, str]:
    """Beat: probe every backend's health (free requests only)."""
    return _backends_probe()
