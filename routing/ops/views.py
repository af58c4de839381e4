"""The ops dashboard: one page of panels that refresh themselves (htmx polling every
FAIRLANE_OPS_POLL_SECONDS: backends, fair queue, workers, alerts; spend, which sums the ledger,
three times less often), a page per
tenant (its agents' spend against their budgets, its alerts), and the platform's alert
destinations. Thin: each panel is one selector call and a template."""

import json
from datetime import timedelta

from django.conf import settings
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from routing.batches.services import batches_backlog
from routing.ops import selectors
from routing.ops.access import staff_page
from routing.ops.capacity import LOAD_MINUTES, capacity_overview
from tenants import selectors as tenant_selectors
from tenants.errors import InvalidRequest, NotFound
from tenants.portal.alert_forms import DestinationForm
from tenants.portal.forms import form_error_apply
from tenants.reports.spend import spend_overview
from tenants.services import alerts
from workers.selectors import model_states
from workers.serving.runtime import Runtime


def _backends(runtime: Runtime) -> dict:
    return {"backends": selectors.backends_overview(runtime=runtime)}


def _queue(runtime: Runtime) -> dict:
    return {
        "queues": selectors.queue_overview(runtime=runtime),
        "batch_backlog": batches_backlog(),
    }


def _workers(runtime: Runtime) -> dict:
    workers = runtime.pool.worker_states()
    return {"workers": workers, "models": model_states(workers=workers), "mode": runtime.mode}


def _capacity(runtime: Runtime) -> dict:
    return {"capacity": capacity_overview(runtime=runtime), "load_minutes": LOAD_MINUTES}


def _spend(runtime: Runtime) -> dict:
    now = timezone.now()
    day = selectors.spend_since(since=now - timedelta(hours=24))
    chart = {
        "unit": "USD",
        "labels": [f"{r['backend'] or '?'} · {r['model'] or '?'}" for r in day["by_route"]],
        "datasets": [
            {
                "label": "spend, last 24 h",
                "data": [r["cost"] / 100_000_000 for r in day["by_route"]],
            }
        ],
    }
    return {
        "day": day,
        "hour": selectors.spend_since(since=now - timedelta(hours=1)),
        "budgets": selectors.budgets_nearest(now=now),
        "soft_crossed": selectors.budgets_soft_crossed(now=now),
        "chart_json": json.dumps(chart),
        "spend_poll_seconds": 3 * settings.FAIRLANE_OPS_POLL_SECONDS,
    }


def _alerts(runtime: Runtime) -> dict:
    return {"alerts": selectors.alerts_recent(limit=15)}


PANELS = {
    "backends": _backends,
    "queue": _queue,
    "workers": _workers,
    "capacity": _capacity,
    "spend": _spend,
    "alerts": _alerts,
}


def _context(**extra) -> dict:
    return {"poll_seconds": settings.FAIRLANE_OPS_POLL_SECONDS, "section": "dashboard", **extra}


@staff_page()
def dashboard(request):
    context = _context()
    for build in PANELS.values():
        context.update(build(request.runtime))
    return render(request, "ops/dashboard.html", context)


@staff_page()
def panel(request, name: str):
    if name not in PANELS:
        raise Http404("No such panel.")
    return render(request, f"ops/_{name}.html", _context(**PANELS[name](request.runtime)))


@staff_page()
def tenant(request, slug: str):
    found = selectors.tenant_by_slug(slug=slug)
    if found is None:
        raise Http404("No such tenant.")
    tenant_line, lines, today = spend_overview(tenant=found)
    return render(
        request,
        "ops/tenant.html",
        _context(
            tenant=found,
            tenant_line=tenant_line,
            lines=lines,
            today=today,
            alerts=tenant_selectors.alert_event_list(tenant=found, limit=30),
            destinations=tenant_selectors.alert_destination_list(tenant=found),
            section="tenant",
        ),
    )


@staff_page()
def request_lookup(request):
    """A request's timeline by its x-request-id (or the requests of a trace id)."""
    query = request.GET.get("q", "")
    found = selectors.request_lookup(query=query)
    return render(
        request,
        "ops/request.html",
        _context(
            query=query.strip(),
            in_flight=found.in_flight,
            section="requests",
            requests=[(r, selectors.request_timeline(r)) for r in found.records],
        ),
    )


def _alerts_page(request, form=None, status=200):
    return render(
        request,
        "ops/alerts.html",
        _context(
            destinations=tenant_selectors.alert_destination_list(tenant=None),
            form=form or DestinationForm(),
            alerts=selectors.alerts_recent(limit=100),
            section="alerts",
        ),
        status=status,
    )


@staff_page()
def alert_settings(request):
    return _alerts_page(request)


@never_cache
@staff_page(write=True)
def alert_destination_add(request):
    form = DestinationForm(request.POST)
    if form.is_valid():
        try:
            destination, secret = alerts.alert_destination_add(
                tenant=None, kind=form.cleaned_data["kind"], target=form.cleaned_data["target"]
            )
        except InvalidRequest as exc:
            form_error_apply(form, exc)
        else:
            if not secret:
                return redirect("ops:alerts")
            response = render(
                request,
                "ops/alert_created.html",
                _context(destination=destination, secret=secret, section="alerts"),
                status=201,
            )
            response["Cache-Control"] = "no-store"
            return response
    return _alerts_page(request, form=form, status=400)


@staff_page(write=True)
def alert_destination_remove(request, destination_id):
    try:
        alerts.alert_destination_remove(tenant=None, destination_id=destination_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    return redirect("ops:alerts")
