"""The rules a budget is watched by: thresholds (percent of the limit actually spent) and the
forecast. A budget with none of its own has the defaults: 50, 80 and 100 %, and the forecast."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.db import transaction

from tenants.errors import InvalidRequest
from tenants.models import DEFAULT_THRESHOLDS, FORECAST, AlertRule, Budget, Tenant, threshold_rule
from tenants.services.audit import audit_record

MAX_THRESHOLDS = 10


@dataclass(frozen=True, slots=True)
class Rule:
    key: str  # "threshold:80" or "forecast": what a rule's state is kept under
    percent: int | None  # None: the forecast

    @property
    def is_forecast(self) -> bool:
        return self.percent is None


DEFAULT_RULES = tuple(
    [Rule(threshold_rule(p), p) for p in DEFAULT_THRESHOLDS] + [Rule(FORECAST, None)]
)


def budget_rules(budget: Budget) -> tuple[Rule, ...]:
    """The budget's rules (reads `budget.alert_rules`, so prefetch it for many budgets)."""
    rows = list(budget.alert_rules.all())
    if not rows:
        return DEFAULT_RULES
    return tuple(
        Rule(row.key, None if row.kind == AlertRule.Kind.FORECAST else row.percent)
        for row in sorted(rows, key=lambda r: (r.kind == AlertRule.Kind.FORECAST, r.percent or 0))
        if row.kind != AlertRule.Kind.OFF
    )


RULES_CACHE_SECONDS = 10.0
_cache: dict[str, tuple[float, tuple[Rule, ...]]] = {}


def budget_rules_cached(budget: Budget) -> tuple[Rule, ...]:
    """The budget's rules as this process read them at most RULES_CACHE_SECONDS ago (the
    settlement path: a change made in another process applies within that time)."""
    cached = _cache.get(str(budget.pk))
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    rules = budget_rules(budget)
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[str(budget.pk)] = (time.monotonic() + RULES_CACHE_SECONDS, rules)
    return rules


def rules_cached_clear() -> None:
    _cache.clear()


def _thresholds_clean(thresholds) -> list[int]:
    if not isinstance(thresholds, list | tuple) or len(thresholds) > MAX_THRESHOLDS:
        raise InvalidRequest(
            f"thresholds must be a list of at most {MAX_THRESHOLDS} percentages.",
            param="thresholds",
        )
    for value in thresholds:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise InvalidRequest(
                "Each threshold is a whole percentage from 1 to 1000.", param="thresholds"
            )
    return sorted(set(thresholds))


def alert_rules_set(
    *, tenant: Tenant, budget: Budget, thresholds: list[int], forecast: bool
) -> tuple[Rule, ...]:
    """Replace a budget's rules. The defaults are stored as no rows (so they follow the
    platform's defaults); no thresholds and no forecast silences the budget."""
    if budget.tenant_id != tenant.id:
        raise InvalidRequest("budget does not belong to this tenant.", param="budget")
    percents = _thresholds_clean(thresholds)
    forecast = bool(forecast)
    before = _rules_view(budget_rules(budget))
    with transaction.atomic():
        AlertRule.objects.filter(budget=budget).delete()
        if percents != sorted(DEFAULT_THRESHOLDS) or not forecast:
            rows = [
                AlertRule(budget=budget, kind=AlertRule.Kind.THRESHOLD, percent=p) for p in percents
            ]
            if forecast:
                rows.append(AlertRule(budget=budget, kind=AlertRule.Kind.FORECAST))
            AlertRule.objects.bulk_create(
                rows or [AlertRule(budget=budget, kind=AlertRule.Kind.OFF)]
            )
        rules = budget_rules(Budget.objects.prefetch_related("alert_rules").get(pk=budget.pk))
        audit_record(
            action="alert_rules.set",
            object_type="budget",
            object_id=budget.pk,
            object_repr=str(budget),
            tenant=tenant,
            before=before,
            after=_rules_view(rules),
        )
    _cache.pop(str(budget.pk), None)
    return rules


def _rules_view(rules: tuple[Rule, ...]) -> dict:
    return {
        "thresholds": [r.percent for r in rules if not r.is_forecast],
        "forecast": any(r.is_forecast for r in rules),
    }
