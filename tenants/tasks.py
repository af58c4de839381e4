from celery import shared_task

from tenants.services.alerts import alert_deliveries_send_due
from tenants.services.alerts import alert_delivery_send as _send
from tenants.services.alerts import budget_alerts_sweep as _sweep
from tenants.services.budgets import budget_reservations_expire as _expire


@shared_task(name="tenants.tasks.budget_reservations_expire")
def budget_reservations_expire() -> int:
    """Beat, every minute: release budget held by requests whose API process died."""
    return _expire()


@shared_task(name="tenants.tasks.alert_delivery_send", ignore_result=True)
def alert_delivery_send(delivery_id: str) -> None:
    """One attempt at an alert's delivery; a failure queues the next after its backoff."""
    retry_in = _send(delivery_id=delivery_id)
    if retry_in is not None:
        alert_delivery_send.apply_async((delivery_id,), countdown=retry_in, ignore_result=True)


@shared_task(name="tenants.tasks.budget_alerts_sweep", ignore_result=True)
def budget_alerts_sweep() -> dict[str, int]:
    """Beat: forecasts, missed thresholds and re-arming in every current window, then any
    delivery that is due and was not sent (its task was lost)."""
    return {"fired": _sweep(), "sent": alert_deliveries_send_due()}
