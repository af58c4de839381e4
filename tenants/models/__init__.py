"""The tenancy core: tenants and their members, agents, API keys (tenancy.py), budgets and the
usage ledger (budgets.py), and budget alerts (alerts.py). Import them from here."""

from tenants.models.alerts import (
    DEFAULT_THRESHOLDS, FORECAST, AlertDelivery, AlertDestination, AlertEvent, AlertEventName,
    AlertRule, AlertState, threshold_rule,
)
from tenants.models.budgets import (
    MAX_MICROCENTS, MICROCENTS_PER_CENT, MICROCENTS_PER_USD, Budget, BudgetWindow, Period,
    Reservation, UsageRecord,
)
from tenants.models.tenancy import (
    ROLE_RANK, Agent, ApiKey, Lane, Membership, RateLimits, Role, Scope, Tenant, name_validator,
    timezone_names, validate_timezone,
)

__all__ = [
    "DEFAULT_THRESHOLDS", "FORECAST", "MAX_MICROCENTS", "MICROCENTS_PER_CENT", "MICROCENTS_PER_USD",
    "ROLE_RANK", "Agent", "AlertDelivery", "AlertDestination", "AlertEvent", "AlertEventName",
    "AlertRule", "AlertState", "ApiKey", "Budget", "BudgetWindow", "Lane", "Membership", "Period",
    "RateLimits", "Reservation", "Role", "Scope", "Tenant", "UsageRecord", "name_validator",
    "threshold_rule", "timezone_names", "validate_timezone",
]
