"""Budget alerts: rules per budget (defaults 50/80/100 % of actual spend and a forecast),
state per rule and window (each crossing fires once), evaluated on settlement and by the beat,
sent in-app, by email and to signed webhooks. See docs/ops.md, "Budget alerts"."""

from tenants.services.alerts.deliver import (
    CeleryAlertSender,
    EmbeddedAlertSender,
    alert_deliveries_send_due,
    alert_delivery_send,
)
from tenants.services.alerts.destinations import (
    alert_destination_add,
    alert_destination_get,
    alert_destination_remove,
)
from tenants.services.alerts.evaluate import (
    budget_alerts_evaluate,
    budget_alerts_sweep,
    budget_exhausted_alert,
)
from tenants.services.alerts.rules import alert_rules_set, budget_rules

__all__ = [
    "CeleryAlertSender",
    "EmbeddedAlertSender",
    "alert_deliveries_send_due",
    "alert_delivery_send",
    "alert_destination_add",
    "alert_destination_get",
    "alert_destination_remove",
    "alert_rules_set",
    "budget_alerts_evaluate",
    "budget_alerts_sweep",
    "budget_exhausted_alert",
    "budget_rules",
]
