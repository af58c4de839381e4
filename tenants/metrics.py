"""Prometheus figures of the budgets: settlements that found less room than their cost (their
hold had been released meanwhile, or the limit lowered), and how much was left unbilled; spend
per tenant and budget alerts, counted across processes."""

import logging

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily

from tenants.counters import SharedCounts

logger = logging.getLogger(__name__)

SETTLEMENTS_CAPPED = Counter(
    "fairlane_budget_settlements_capped_total",
    "settlements that charged less than their cost to keep a budget within its limit",
)
UNBILLED = Counter(
    "fairlane_budget_unbilled_microcents_total",
    "cost recorded on the ledger as unbilled because no budget room was left",
)

# -- counts kept across processes and hosts (tenants/counters.py), exported at scrape time -----
# Settlements and alerts happen in API processes and in GPU workers, which serve no /metrics.
SPEND = SharedCounts("fl:metrics:spend")  # tenant slug -> micro-cents charged
ALERTS = SharedCounts("fl:metrics:alerts")  # "<tenant>\x1f<event>" -> alerts fired
DELIVERIES = SharedCounts("fl:metrics:deliveries")  # "<kind>\x1f<outcome>" -> attempts
SEP = "\x1f"


class SharedCountsCollector:
    """`fairlane_tenant_spend_microcents_total{tenant}`, `fairlane_budget_alerts_total{tenant,
    event}` and `fairlane_alert_deliveries_total{kind,outcome}`, from the shared counts, read
    with the runtime's Redis client (`client`, set when a runtime is installed)."""

    client = None

    FAMILIES = (
        (
            SPEND,
            "fairlane_tenant_spend_microcents",
            "micro-cents charged to each tenant's budgets (settled requests)",
            ["tenant"],
        ),
        (
            ALERTS,
            "fairlane_budget_alerts",
            "budget alerts fired, by LiteLLM's event name",
            ["tenant", "event"],
        ),
        (
            DELIVERIES,
            "fairlane_alert_deliveries",
            "alert delivery attempts: delivered, retry (failed, to be retried) or failed (gave up)",
            ["kind", "outcome"],
        ),
    )

    def describe(self):
        return [
            CounterMetricFamily(name, text, labels=labels)
            for _, name, text, labels in self.FAMILIES
        ]

    def collect(self):
        for counts, name, text, labels in self.FAMILIES:
            family = CounterMetricFamily(name, text, labels=labels)
            try:
                totals = counts.totals(self.client)
            except Exception:  # a scrape must not fail because Redis blinked
                logger.exception("%s unavailable", name)
                totals = {}
            for field, value in sorted(totals.items()):
                values = field.split(SEP)
                if len(values) == len(labels):
                    family.add_metric(values, value)
            yield family


COLLECTOR = SharedCountsCollector()
_registered = False


def counts_collector_register(client) -> None:
    """Register the shared counts' collector (once per process) and point it at `client`
    (the runtime's Redis; None: this process's counts alone)."""
    global _registered
    if not _registered:
        REGISTRY.register(COLLECTOR)
        _registered = True
    COLLECTOR.client = client
