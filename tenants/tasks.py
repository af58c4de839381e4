import json
import logging

from celery import shared_task
from django.conf import settings
from django.core.management import call_command

from tenants.services.alerts import alert_deliveries_send_due
from tenants.services.alerts import alert_delivery_send as _send
from tenants.services.alerts import budget_alerts_sweep as _sweep
from tenants.services.budget_reconcile import budget_windows_reconcile as _reconcile
from tenants.services.budgets import budget_reservations_expire as _expire
from tenants.services.request_logs import request_logs_expire as _logs_expire

logger = logging.getLogger(__name__)


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


@shared_task(name="tenants.tasks.audit_retention", ignore_result=True)
def audit_retention() -> None:
    """Beat, daily: audit records past FAIRLANE_AUDIT_RETENTION_DAYS go, deleted as the
    retention role (nothing when retention is off or its connection is not set)."""
    if settings.FAIRLANE_AUDIT_RETENTION_DAYS and (
        settings.FAIRLANE_AUDIT_RETENTION_DATABASE_URL
        or settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    ):
        call_command("audit_retention")


@shared_task(name="tenants.tasks.request_logs_expire", ignore_result=True)
def request_logs_expire() -> int:
    """Beat, every FAIRLANE_REQUEST_LOG_SWEEP_SECONDS: request logs past their tenant's
    retention are deleted."""
    return _logs_expire()


@shared_task(name="tenants.tasks.budget_windows_reconcile", ignore_result=True)
def budget_windows_reconcile() -> dict[str, int]:
    """Beat, nightly: every budget window checked against the ledger and the open holds;
    each difference is logged as a warning, none corrected (an operator runs
    `manage.py budgets_reconcile --fix` after reading them)."""
    report = _reconcile()
    for check in report.differences:
        logger.warning("budget reconciliation: %s", json.dumps(check.as_json()))
    return {"checked": report.windows_checked, "differences": len(report.differences)}
