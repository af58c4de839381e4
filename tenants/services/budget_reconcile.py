"""Reconciliation: each budget window's counters recomputed from the ledger and the holds, and
every difference reported with the rows behind it. A window's `spent_microcents` should be
what the ledger charged for its owner's requests reserved in its time (the rule a window opens
with, tenants/windows.py), and its `reserved_microcents` the sum of the holds still open on
it. Differences are corrected only when asked (`fix=True`), each correction audited.

Each window is checked under its row lock, so a hold or a settlement of that window is either
wholly counted on both sides or not yet at all: a busy window shows no difference that is not
real. A window that overlaps another of its budget (the tenant's time zone or the budget's
period changed during it) has its spent left unchecked: requests of the overlap were charged
to one of the two, and the ledger does not say which; its holds are still checked.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import transaction

from tenants.models import Budget, BudgetWindow, Tenant
from tenants.services.audit import audit_change, snapshot
from tenants.windows import window_reservations_open, window_usage_settled


@dataclass(frozen=True, slots=True)
class WindowCheck:
    """One window as stored and as recomputed, with the rows the recomputation summed: the
    ledger rows (UsageRecord ids) behind `spent`, the open holds (Reservation ids) behind
    `reserved`."""

    window_id: int
    budget_id: uuid.UUID
    tenant: str  # the tenant's slug
    owner: str  # the agent's name, the key's prefix, the member's username, or "tenant"
    models: tuple[str, ...]  # the budget's model filter (empty: every model)
    period: str
    start: datetime
    end: datetime
    spent_stored: int
    spent_recomputed: int | None  # None: not checked (the window overlaps another)
    reserved_stored: int
    reserved_recomputed: int
    usage_ids: tuple[int, ...]
    reservation_ids: tuple[uuid.UUID, ...]
    fixed: bool = False

    @property
    def differs(self) -> bool:
        spent_differs = self.spent_recomputed is not None and (
            self.spent_recomputed != self.spent_stored
        )
        return spent_differs or self.reserved_recomputed != self.reserved_stored

    def as_json(self) -> dict:
        return {
            "window_id": self.window_id,
            "budget_id": str(self.budget_id),
            "tenant": self.tenant,
            "owner": self.owner,
            "models": list(self.models),
            "period": self.period,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "spent": {"stored": self.spent_stored, "recomputed": self.spent_recomputed},
            "reserved": {"stored": self.reserved_stored, "recomputed": self.reserved_recomputed},
            "usage_ids": list(self.usage_ids),
            "reservation_ids": [str(i) for i in self.reservation_ids],
            "fixed": self.fixed,
        }


@dataclass(slots=True)
class Reconciliation:
    windows_checked: int = 0
    differences: list[WindowCheck] = field(default_factory=list)

    @property
    def unfixed(self) -> list[WindowCheck]:
        return [d for d in self.differences if not d.fixed]

    def as_json(self) -> dict:
        return {
            "windows_checked": self.windows_checked,
            "differences": [d.as_json() for d in self.differences],
        }


def _overlapping(windows: list[BudgetWindow]) -> set[int]:
    """The ids of the windows that share time with another window of the same budget."""
    found: set[int] = set()
    ordered = sorted(windows, key=lambda w: (w.budget_id, w.start))
    for i, window in enumerate(ordered):
        for later in ordered[i + 1 :]:
            if later.budget_id != window.budget_id or later.start >= window.end:
                break
            found.update((window.pk, later.pk))
    return found


def budget_windows_reconcile(*, tenant: Tenant | None = None, fix: bool = False) -> Reconciliation:
    """Check every budget window (only `tenant`'s when given) against the ledger and the open
    holds; with `fix`, set each differing window to what was recomputed and audit it. A system
    task over all tenants when `tenant` is None, like the expiry of holds."""
    budgets = Budget.objects.all() if tenant is None else Budget.objects.filter(tenant=tenant)
    windows = list(
        BudgetWindow.objects.filter(budget__in=budgets).only("pk", "budget_id", "start", "end")
    )
    overlapping = _overlapping(windows)
    report = Reconciliation()
    for window in sorted(windows, key=lambda w: (w.budget_id, w.start)):
        check = _window_check(window_id=window.pk, fix=fix, spent=window.pk not in overlapping)
        report.windows_checked += 1
        if check.differs:
            report.differences.append(check)
    return report


def _window_check(*, window_id: int, fix: bool, spent: bool) -> WindowCheck:
    with transaction.atomic():
        window = (
            BudgetWindow.objects.select_for_update(of=("self",))
            .select_related(
                "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
            )
            .get(pk=window_id)
        )
        check = _window_recompute(window=window, spent=spent)
        if fix and check.differs:
            _window_correct(window=window, check=check)
            return replace(check, fixed=True)
        return check


def _window_recompute(*, window: BudgetWindow, spent: bool) -> WindowCheck:
    """The window as stored and as the ledger and its holds say (the holds it names: a hold
    moved to a window opened by a change of zone or period is that window's)."""
    budget = window.budget
    open_holds = window_reservations_open(budget=budget, start=window.start, end=window.end)
    if budget.slot == "extra":  # a JSON list: filtered here, the same on both databases
        holds = [
            (pk, amount)
            for pk, amount, extra in open_holds.values_list(
                "pk", "amount_microcents", "extra_windows"
            ).order_by("pk")
            if window.pk in (extra or ())
        ]
    else:
        holds = list(
            open_holds.filter(**{f"{budget.slot}_window": window})
            .values_list("pk", "amount_microcents")
            .order_by("pk")
        )
    usage = (
        window_usage_settled(budget=budget, start=window.start, end=window.end)
        .values_list("pk", "cost_microcents")
        .order_by("pk")
    )
    charged = list(usage) if spent else []
    return WindowCheck(
        window_id=window.pk,
        budget_id=budget.pk,
        tenant=budget.tenant.slug,
        owner=_owner(budget),
        models=tuple(budget.model_names),
        period=budget.period,
        start=window.start,
        end=window.end,
        spent_stored=window.spent_microcents,
        spent_recomputed=sum(cost for _, cost in charged) if spent else None,
        reserved_stored=window.reserved_microcents,
        reserved_recomputed=sum(amount for _, amount in holds),
        usage_ids=tuple(pk for pk, _ in charged),
        reservation_ids=tuple(pk for pk, _ in holds),
    )


def _owner(budget: Budget) -> str:
    if budget.agent is not None:
        return budget.agent.name
    if budget.api_key is not None:
        return budget.api_key.prefix
    if budget.member is not None:
        return budget.member.user.get_username()
    return "tenant"


def _window_correct(*, window: BudgetWindow, check: WindowCheck) -> None:
    before = snapshot(window)
    if check.spent_recomputed is not None:
        window.spent_microcents = check.spent_recomputed
    window.reserved_microcents = check.reserved_recomputed
    BudgetWindow.objects.filter(pk=window.pk).update(
        spent_microcents=window.spent_microcents, reserved_microcents=window.reserved_microcents
    )
    audit_change("budget_window.reconcile", window, before=before, tenant=window.budget.tenant)
