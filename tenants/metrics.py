"""Prometheus figures of the budgets: settlements that found less room than their cost (their
hold had been released meanwhile, or the limit lowered), and how much was left unbilled."""

from prometheus_client import Counter

SETTLEMENTS_CAPPED = Counter(
    "fairlane_budget_settlements_capped_total",
    "settlements that charged less than their cost to keep a budget within its limit")
UNBILLED = Counter("fairlane_budget_unbilled_microcents_total",
                   "cost recorded on the ledger as unbilled because no budget room was left")
