"""What every portal page shows around its content: the tenant switcher, the navigation,
and the banners saying why something is refused (budget nearly or fully spent, tenant
suspended)."""

from django.shortcuts import render
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from tenants import selectors
from tenants.models import Role
from tenants.portal.access import Portal
from tenants.reports.spend import spend_alerts

SECTIONS = [
    ("overview", "Overview", Role.VIEWER),
    ("agents", "Agents", Role.VIEWER),
    ("budgets", "Budgets", Role.VIEWER),
    ("keys", "Keys", Role.VIEWER),
    ("usage", "Usage", Role.VIEWER),
    ("batches", "Batches", Role.VIEWER),  # routing's page (platform/urls.py mounts it)
    ("members", "Members", Role.VIEWER),
    ("alerts", "Alerts", Role.VIEWER),
    ("playground", "Playground", Role.VIEWER),
    ("identity", "Sign-in", Role.ADMIN),
    ("audit", "Audit", Role.ADMIN),
    ("request_logs", "Request logs", Role.ADMIN),
]


def _banners(portal: Portal) -> list[dict]:
    banners = []
    if portal.read_only_reason:
        banners.append({"level": "error", "text": portal.read_only_reason})
    for line in spend_alerts(tenant=portal.tenant):
        title = line.budget.title if line.budget is not None else "A budget"
        end = f"{timezone.localtime(line.window_end):%Y-%m-%d %H:%M} {portal.tenant.timezone}"
        if line.state == "exhausted":
            text = (
                f"{title} is spent: its API requests are "
                f"refused (429 budget_exhausted) until the window resets at "
                f"{end}. The portal keeps working."
            )
        else:
            text = f"{title} is {line.used_percent} % used (resets at {end})."
        banners.append({"level": "error" if line.state == "exhausted" else "warning", "text": text})
    for event in selectors.alert_forecasts_current(tenant=portal.tenant):
        banners.append({"level": "warning", "text": event.message})
    return banners


def render_page(
    request, portal: Portal, template: str, context: dict, *, section: str, status: int = 200
):
    context = {
        **context,
        "portal": portal,
        "section": section,
        "sections": [s for s in SECTIONS if portal.at_least(s[2])],
        "my_tenants": SimpleLazyObject(lambda: list(selectors.tenant_list(user=request.user))),
        "banners": SimpleLazyObject(lambda: _banners(portal)),
    }
    return render(request, template, context, status=status)
