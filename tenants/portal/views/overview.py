"""Overview: spend in each budget's window, what remains, when it runs out at the trailing
hour's rate; requests and errors today. The figures fragment polls itself (htmx)."""

from django.shortcuts import render

from tenants.portal.access import portal_page
from tenants.portal.pages import render_page
from tenants.reports.spend import RUN_RATE_WINDOW, spend_overview

POLL_SECONDS = 15


def _figures(portal) -> dict:
    tenant_line, lines, today = spend_overview(tenant=portal.tenant)
    return {
        "tenant_line": tenant_line,
        "lines": lines,
        "today": today,
        "poll_seconds": POLL_SECONDS,
        "run_rate_minutes": int(RUN_RATE_WINDOW.seconds / 60),
    }


@portal_page()
def overview(request, portal):
    return render_page(
        request, portal, "portal/overview/index.html", _figures(portal), section="overview"
    )


@portal_page()
def overview_figures(request, portal):
    return render(request, "portal/overview/_figures.html", {"portal": portal, **_figures(portal)})
