"""Budget alerts in the portal: what fired, when and for whom, with each delivery's status;
where the tenant's alerts go (email recipients, signed webhooks, whose secret is shown once);
and each budget's rules. Admins change them; everyone in the tenant sees them."""

from django.shortcuts import redirect
from django.views.decorators.cache import never_cache

from tenants import selectors
from tenants.errors import InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.alert_forms import DestinationForm, RulesForm
from tenants.portal.forms import form_error_apply
from tenants.portal.pages import render_page
from tenants.services import alerts


def _rules_form(budget, data=None) -> RulesForm:
    rules = alerts.budget_rules(budget)
    initial = {
        "thresholds": ", ".join(str(r.percent) for r in rules if not r.is_forecast),
        "forecast": any(r.is_forecast for r in rules),
    }
    return RulesForm(data, initial=initial, prefix=f"b{str(budget.pk)[:8]}")


def _page(request, portal, *, form=None, rules_forms=None, status=200):
    budgets = selectors.budget_list(tenant=portal.tenant).prefetch_related("alert_rules")
    rules_forms = rules_forms or {}
    rows = [{"budget": b, "form": rules_forms.get(b.pk) or _rules_form(b)} for b in budgets]
    return render_page(
        request,
        portal,
        "portal/alerts/index.html",
        {
            "events": selectors.alert_event_list(tenant=portal.tenant),
            "destinations": selectors.alert_destination_list(tenant=portal.tenant),
            "form": form or DestinationForm(),
            "budgets": rows,
        },
        section="alerts",
        status=status,
    )


@portal_page()
def alert_list(request, portal):
    return _page(request, portal)


@never_cache
@portal_page(Role.ADMIN, write=True)
def alert_destination_add(request, portal):
    form = DestinationForm(request.POST)
    if form.is_valid():
        try:
            destination, secret = alerts.alert_destination_add(
                tenant=portal.tenant,
                kind=form.cleaned_data["kind"],
                target=form.cleaned_data["target"],
            )
        except InvalidRequest as exc:
            form_error_apply(form, exc)
        else:
            if not secret:
                return redirect("portal:alerts", slug=portal.tenant.slug)
            response = render_page(
                request,
                portal,
                "portal/alerts/created.html",
                {"destination": destination, "secret": secret},
                section="alerts",
                status=201,
            )
            response["Cache-Control"] = "no-store"
            return response
    return _page(request, portal, form=form, status=400)


@portal_page(Role.ADMIN, write=True)
def alert_destination_remove(request, portal, destination_id):
    alerts.alert_destination_remove(tenant=portal.tenant, destination_id=destination_id)
    return redirect("portal:alerts", slug=portal.tenant.slug)


@portal_page(Role.ADMIN, write=True)
def alert_rules_save(request, portal, budget_id):
    budget = selectors.budget_get(tenant=portal.tenant, budget_id=budget_id)
    form = _rules_form(budget, request.POST)
    if form.is_valid():
        try:
            alerts.alert_rules_set(
                tenant=portal.tenant,
                budget=budget,
                thresholds=form.cleaned_data["thresholds"],
                forecast=form.cleaned_data["forecast"],
            )
            return redirect("portal:alerts", slug=portal.tenant.slug)
        except InvalidRequest as exc:
            form.add_error("thresholds", exc.message)
    return _page(request, portal, rules_forms={budget.pk: form}, status=400)
