"""Evaluating budget alert rules.

- On settlement (`budget_alerts_evaluate`, one call in budget_settle): after the settlement
  commits, each of its windows is compared before and after its charge, and the threshold
  rules now reached fire. Cheap: one query (the windows with their budgets) per settlement,
  more only when a rule is reached and this process has not seen it fire.
- On refusal (`budget_exhausted_alert`, called when a hold is refused for lack of room): an
  exact budget never reaches 100 % spent, since every request holds its worst case first, so
  the 100 % rule (`budget_crossed`) fires when the budget first refuses a request in a window.
- By the beat (`budget_alerts_sweep`): the forecast of every current window (projected to run
  out before the window ends at the trailing hour's rate), the thresholds again (a settlement
  whose process died before its hook ran), and re-arming rules whose limit was raised above
  the mark.

A rule's state per window turns OK into ALARM in one conditional UPDATE; only the write that
wins fires, so a crossing fires once however many settlements see it at the same time.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from tenants.cache import epoch, hot_cache
from tenants.metrics import SPEND
from tenants.models import AlertState, BudgetWindow, Tenant, UsageRecord, threshold_rule
from tenants.reports.spend import RUN_RATE_WINDOW
from tenants.services.alerts.events import alert_event_create
from tenants.services.alerts.rules import (
    Rule,
    budget_rules,
    budget_rules_cached,
    rules_cached_clear,
)
from tenants.windows import window_usage_settled

logger = logging.getLogger(__name__)

# (window, rule, limit) this process saw in ALARM: later settlements skip the state query.
_alarmed: set[tuple[int, str, int]] = set()
_slugs: dict[int, str] = {}


def rules_cache_clear() -> None:
    """Forget what this process cached (tests)."""
    rules_cached_clear()
    _alarmed.clear()
    _windows.clear()


def _reached(spent: int, limit: int, percent: int | None) -> bool:
    """Whether a threshold rule's level is reached (a forecast, with no level, never is)."""
    return percent is not None and spent * 100 >= limit * percent


def budget_alerts_evaluate(
    *,
    tenant: Tenant,
    window_ids: Iterable[int | None],
    charge: int,
    spent_after: dict | None = None,
) -> None:
    """Settlement's hook: once the settlement commits, count its spend and fire the threshold
    rules its charge reached in each of its windows. Never raises into the settlement.
    `spent_after` (window id -> its spent after this charge, when the settlement returned
    them) spares the query for the windows."""
    ids = tuple(i for i in window_ids if i)
    if charge <= 0:
        return

    def after_commit() -> None:
        try:
            _spend_count(tenant_id=tenant.pk, charge=charge)
            if ids:
                _windows_check(ids=ids, charge=charge, spent_after=spent_after)
        except Exception:  # alerts are a side effect: the settlement stands
            logger.exception("budget alerts: evaluating windows %s failed", ids)

    if connection.in_atomic_block:
        transaction.on_commit(after_commit)
    else:  # committed already (on_commit would take a connection only to learn that)
        after_commit()


def _spend_count(*, tenant_id: int, charge: int) -> None:
    slug = _slugs.get(tenant_id)
    if slug is None:
        slug = Tenant.objects.filter(pk=tenant_id).values_list("slug", flat=True).first() or ""
        if len(_slugs) > 10_000:
            _slugs.clear()
        _slugs[tenant_id] = slug
    SPEND.add(slug, charge)


_windows = hot_cache("alert-windows")  # id -> BudgetWindow with its budget (tenants/cache.py)


def _windows_of(ids: tuple[int, ...], spent_after: dict | None) -> list[BudgetWindow]:
    """The windows with their budgets: the cached rows with the spent the settlement returned,
    or (when it did not, or on first sight) read again."""
    if spent_after and all(spent_after.get(i) is not None for i in ids):
        cached = [w for i in ids if (w := _windows.get(i)) is not None]
        if len(cached) == len(ids):
            copies: list[BudgetWindow] = [copy.copy(w) for w in cached]
            for window in copies:
                window.spent_microcents = spent_after[window.pk]
            return copies
    read_at = epoch()
    windows = list(
        BudgetWindow.objects.filter(pk__in=ids).select_related(
            "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
        )
    )
    for window in windows:
        _windows.put(window.pk, window, read_at)
    return windows


def _windows_check(*, ids: tuple[int, ...], charge: int, spent_after: dict | None = None) -> None:
    now = timezone.now()
    for window in _windows_of(ids, spent_after):
        limit = window.budget.limit_microcents
        for rule in budget_rules_cached(window.budget):
            if rule.is_forecast or limit <= 0:
                continue
            if not _reached(window.spent_microcents, limit, rule.percent):
                continue
            if (window.pk, rule.key, limit) in _alarmed:
                continue
            crossed = not _reached(window.spent_microcents - charge, limit, rule.percent)
            state = _state_get(window=window, rule=rule)
            _transition(window=window, rule=rule, state=state, holds=True, crossed=crossed, now=now)


EXHAUSTED_RULE = threshold_rule(100)


def budget_exhausted_alert(*, window_id: int, now: datetime | None = None) -> bool:
    """A hold on this window was refused for lack of room: fire the budget's 100 % rule
    (`budget_crossed`, the same body as when spend reaches the limit), once per window however
    many refusals race (the state's conditional UPDATE). A budget without a 100 % rule (its
    own rules leave it out, or it is silenced) fires nothing. Call it outside the refused
    hold's transaction; never raises into the refusal. True when this call fired it."""
    try:
        window = _windows.get(window_id)
        if window is not None:
            limit = window.budget.limit_microcents
            if (window_id, EXHAUSTED_RULE, limit) in _alarmed:
                return False  # the common case: fired already in this window
        window = (
            BudgetWindow.objects.select_related(
                "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
            )
            .filter(pk=window_id)
            .first()
        )
        if window is None or window.budget.limit_microcents <= 0:
            return False  # a zero limit keeps paid backends out: no exhaustion to report
        _windows.put(window_id, window, epoch())
        rule = next(
            (r for r in budget_rules_cached(window.budget) if r.key == EXHAUSTED_RULE), None
        )
        if rule is None:
            return False
        state = _state_get(window=window, rule=rule)
        return _transition(
            window=window,
            rule=rule,
            state=state,
            holds=True,
            crossed=True,
            now=now or timezone.now(),
        )
    except Exception:  # alerts are a side effect: the refusal stands
        logger.exception("budget alerts: the exhaustion alert of window %s failed", window_id)
        return False


SOFT_RULE = "soft_limit"


def budget_soft_alert(*, window_id: int, now: datetime | None = None) -> bool:
    """The window's spent + reserved reached its budget's soft level: fire the `soft_limit`
    rule (a `threshold_crossed` event at the soft level's percent of the limit), once per
    window, as the threshold rules are. Fires whatever the budget's own rules say (the soft
    level is its own rule). Never raises into the request. True when this call fired it."""
    try:
        cached = _windows.get(window_id)
        if cached is not None:
            key = (window_id, SOFT_RULE, cached.budget.limit_microcents)
            if key in _alarmed:
                return False
        window = (
            BudgetWindow.objects.select_related(
                "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
            )
            .filter(pk=window_id)
            .first()
        )
        if window is None or window.budget.soft_limit_microcents is None:
            return False
        _windows.put(window_id, window, epoch())
        limit = window.budget.limit_microcents
        percent = window.budget.soft_limit_microcents * 100 // limit if limit > 0 else 99
        rule = Rule(SOFT_RULE, min(max(percent, 1), 99))  # a soft level is never "spent"
        state = _state_get(window=window, rule=rule)
        return _transition(
            window=window,
            rule=rule,
            state=state,
            holds=True,
            crossed=True,
            now=now or timezone.now(),
        )
    except Exception:  # alerts are a side effect: the request goes on
        logger.exception("budget alerts: the soft-limit alert of window %s failed", window_id)
        return False


def _state_get(*, window: BudgetWindow, rule: Rule) -> AlertState:
    state, _ = AlertState.objects.get_or_create(
        budget_id=window.budget_id,
        window_start=window.start,
        rule=rule.key,
        defaults={"tenant_id": window.budget.tenant_id},
    )
    return state


def _transition(
    *,
    window: BudgetWindow,
    rule: Rule,
    state: AlertState,
    holds: bool,
    crossed: bool,
    now: datetime,
    projected_at: datetime | None = None,
    projected_spend: int | None = None,
) -> bool:
    """Move a rule's state as the window now stands; True when this call fired it.

    OK and the rule holds: fire. ALARM at a lower limit (it was raised): fire again when this
    settlement crossed the new mark; re-arm (OK) when the rule no longer holds; else keep the
    alarm at the new limit."""
    limit = window.budget.limit_microcents
    rows = AlertState.objects.filter(
        pk=state.pk, state=state.state, limit_microcents=state.limit_microcents
    )
    if state.state == AlertState.State.ALARM:
        if state.limit_microcents >= limit:
            if holds:
                _alarmed.add((window.pk, rule.key, limit))
            return False
        if not holds:
            rows.update(state=AlertState.State.OK, limit_microcents=limit, changed_at=now)
            return False
        if not crossed:
            rows.update(limit_microcents=limit, changed_at=now)
            _alarmed.add((window.pk, rule.key, limit))
            return False
    elif not holds:
        return False
    with transaction.atomic():
        if not rows.update(state=AlertState.State.ALARM, limit_microcents=limit, changed_at=now):
            return False  # another settlement fired it
        alert_event_create(
            window=window,
            rule=rule,
            now=now,
            projected_at=projected_at,
            projected_spend=projected_spend,
        )
    if len(_alarmed) > 100_000:
        _alarmed.clear()
    _alarmed.add((window.pk, rule.key, limit))
    return True


# -- the beat ---------------------------------------------------------------------------------


def _rates(*, tenant_ids: set[int], now: datetime) -> dict[tuple[int, object], int]:
    """Micro-cents per hour over the trailing RUN_RATE_WINDOW: per (tenant, agent id), and
    per (tenant, None) for the whole tenant."""
    rows = (
        UsageRecord.objects.filter(
            tenant_id__in=tenant_ids, created_at__gte=now - RUN_RATE_WINDOW, created_at__lte=now
        )
        .order_by()
        .values("tenant_id", "agent_id")
        .annotate(cost=Sum("cost_microcents"))
    )
    hours = RUN_RATE_WINDOW.total_seconds() / 3600
    rates: dict[tuple[int, object], int] = {}
    for row in rows:
        rate = int(row["cost"] / hours)
        rates[(row["tenant_id"], row["agent_id"])] = rate
        rates[(row["tenant_id"], None)] = rates.get((row["tenant_id"], None), 0) + rate
    return rates


def _budget_rate(*, budget, now: datetime) -> int:
    """Micro-cents per hour over the trailing RUN_RATE_WINDOW of the requests one budget of
    another scope (an API key's, a member's, a model filter) applies to."""
    total = window_usage_settled(
        budget=budget, start=now - RUN_RATE_WINDOW, end=now + timedelta(microseconds=1)
    ).aggregate(cost=Sum("cost_microcents"))["cost"]
    return int((total or 0) / (RUN_RATE_WINDOW.total_seconds() / 3600))


def forecast(
    *, window: BudgetWindow, rate: int, now: datetime
) -> tuple[bool, datetime | None, int]:
    """Whether the window runs out before it ends at `rate` micro-cents per hour: (holds,
    when it runs out, what it would have spent by its end). A spent budget is no forecast
    (budget_crossed says it)."""
    limit, spent = window.budget.limit_microcents, window.spent_microcents
    hours_left = max((window.end - now).total_seconds(), 0) / 3600
    projected_spend = spent + int(rate * hours_left)
    if limit <= 0 or spent >= limit or rate <= 0 or projected_spend <= limit:
        return False, None, projected_spend
    return True, now + timedelta(hours=(limit - spent) / rate), projected_spend


def budget_alerts_sweep(*, now: datetime | None = None) -> int:
    """Evaluate every rule of every current window (the beat); returns how many fired."""
    now = now or timezone.now()
    windows = list(
        BudgetWindow.objects.filter(start__lte=now, end__gt=now)
        .select_related(
            "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
        )
        .prefetch_related("budget__alert_rules")
    )
    if not windows:
        return 0
    rates = _rates(tenant_ids={w.budget.tenant_id for w in windows}, now=now)
    states = {
        (s.budget_id, s.window_start, s.rule): s
        for s in AlertState.objects.filter(
            budget_id__in={w.budget_id for w in windows},
            window_start__in={w.start for w in windows},
        )
    }
    fired = 0
    for window in windows:
        budget, limit = window.budget, window.budget.limit_microcents
        for rule in budget_rules(budget):
            projected_at, projected_spend = None, None
            if rule.is_forecast:
                rate = (
                    _budget_rate(budget=budget, now=now)
                    if budget.slot == "extra"
                    else rates.get((budget.tenant_id, budget.agent_id), 0)
                )
                holds, projected_at, projected_spend = forecast(window=window, rate=rate, now=now)
            else:
                holds = limit > 0 and _reached(window.spent_microcents, limit, rule.percent)
            state = states.get((budget.pk, window.start, rule.key))
            if state is None:
                if not holds:
                    continue
                state = _state_get(window=window, rule=rule)
            fired += _transition(
                window=window,
                rule=rule,
                state=state,
                holds=holds,
                crossed=False,
                now=now,
                projected_at=projected_at,
                projected_spend=projected_spend,
            )
    return fired
