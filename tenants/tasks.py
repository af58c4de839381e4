from celery import shared_task

from tenants.services.budgets import budget_reservations_expire as _expire


@shared_task(name="tenants.tasks.budget_reservations_expire")
def budget_reservations_expire() -> int:
    """Beat, every minute: release budget held by requests whose API process died."""
    return _expire()
