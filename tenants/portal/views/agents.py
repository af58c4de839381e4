"""Agents (with their budgets) and the tenant's own budget: list, create, edit, deactivate.
Viewers see them; admins change them, through the API's services."""

from django.shortcuts import redirect

from tenants import selectors
from tenants.errors import ApplicationError, InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.forms import AgentForm, ScopedBudgetForm, TenantBudgetForm, form_error_apply
from tenants.portal.pages import render_page
from tenants.reports.spend import spend_other_budgets, spend_overview
from tenants.services import budgets, tenancy
from tenants.services import portal as portal_services

BUDGET_FIELDS = {
    "limit_microcents": "budget_limit_usd",
    "period": "budget_period",
    "soft_limit_microcents": "budget_soft_limit_usd",
    "soft_action": "budget_soft_action",
    "soft_rpm": "budget_soft_rpm",
    "agent": None,
}


@portal_page()
def agent_list(request, portal):
    tenant_line, lines, _ = spend_overview(tenant=portal.tenant)
    inactive = selectors.agent_list(tenant=portal.tenant).filter(is_active=False)
    return render_page(
        request,
        portal,
        "portal/agents/list.html",
        {"lines": lines, "inactive": inactive},
        section="agents",
    )


def _initial(agent) -> dict:
    budget = agent.budgets.filter(owner_key=f"agent:{agent.pk}").first() if agent else None
    if agent is None:
        return {}
    return {
        "name": agent.name,
        "description": agent.description,
        "allowed_models": ", ".join(agent.allowed_models),
        "lane": agent.lane,
        "rpm_limit": agent.rpm_limit,
        "tpm_limit": agent.tpm_limit,
        "concurrency_limit": agent.concurrency_limit,
        "budget_period": budget.period if budget else "daily",
        "budget_limit_usd": budget.limit_microcents / 100_000_000 if budget else None,
        **_soft_initial(budget),
    }


def _soft_initial(budget) -> dict:
    if budget is None:
        return {}
    soft = budget.soft_limit_microcents
    return {
        "budget_soft_limit_usd": soft / 100_000_000 if soft is not None else None,
        "budget_soft_action": budget.soft_action,
        "budget_soft_rpm": budget.soft_rpm,
    }


def _agent_form_page(request, portal, agent=None):
    form = AgentForm(request.POST or None, initial=_initial(agent))
    if request.method == "POST" and form.is_valid():
        period, limit = form.budget()
        try:
            if agent is None:
                agent = portal_services.agent_setup(
                    tenant=portal.tenant,
                    fields=form.agent_fields(),
                    budget_period=period,
                    budget_limit_microcents=limit,
                    budget_soft=form.budget_soft(),
                )
            else:
                portal_services.agent_change(
                    tenant=portal.tenant,
                    agent=agent,
                    fields=form.agent_fields(),
                    budget_period=period,
                    budget_limit_microcents=limit,
                    budget_soft=form.budget_soft(),
                )
            return redirect("portal:agents", slug=portal.tenant.slug)
        except InvalidRequest as exc:
            form_error_apply(form, exc, BUDGET_FIELDS)
    status = 400 if form.errors else 200
    return render_page(
        request,
        portal,
        "portal/agents/form.html",
        {"form": form, "agent": agent},
        section="agents",
        status=status,
    )


@portal_page(Role.ADMIN, form=True)
def agent_create(request, portal):
    return _agent_form_page(request, portal)


@portal_page(Role.ADMIN, form=True)
def agent_edit(request, portal, agent_id):
    agent = selectors.agent_get(tenant=portal.tenant, agent_id=agent_id)
    return _agent_form_page(request, portal, agent)


@portal_page(Role.ADMIN, write=True)
def agent_deactivate(request, portal, agent_id):
    tenancy.agent_deactivate(agent=selectors.agent_get(tenant=portal.tenant, agent_id=agent_id))
    return redirect("portal:agents", slug=portal.tenant.slug)


def _budgets_page(request, portal, *, form=None, scoped=None, status=200):
    tenant_line, lines, _ = spend_overview(tenant=portal.tenant)
    context = {
        "tenant_line": tenant_line,
        "lines": lines,
        "form": form or TenantBudgetForm(initial=_tenant_budget_initial(tenant_line)),
        "others": spend_other_budgets(tenant=portal.tenant),
        "mine": spend_other_budgets(tenant=portal.tenant, member=portal.membership),
        "scoped_form": scoped or ScopedBudgetForm(tenant=portal.tenant),
    }
    return render_page(
        request, portal, "portal/budgets/list.html", context, section="budgets", status=status
    )


@portal_page()
def budget_list(request, portal):
    return _budgets_page(request, portal)


@portal_page(Role.ADMIN, write=True)
def scoped_budget_create(request, portal):
    form = ScopedBudgetForm(request.POST, tenant=portal.tenant)
    if form.is_valid():
        period, limit = form.budget()
        try:
            budgets.budget_create(
                tenant=portal.tenant,
                period=period,
                limit_microcents=limit,
                model_names=form.cleaned_data["model_names"],
                **form.owners(),
                **form.budget_soft(),
            )
            return redirect("portal:budgets", slug=portal.tenant.slug)
        except ApplicationError as exc:
            form_error_apply(form, exc, {**BUDGET_FIELDS, "scope": "scope"})
    return _budgets_page(request, portal, scoped=form, status=400)


@portal_page(Role.ADMIN, write=True)
def scoped_budget_delete(request, portal, budget_id):
    budgets.budget_delete(budget=selectors.budget_get(tenant=portal.tenant, budget_id=budget_id))
    return redirect("portal:budgets", slug=portal.tenant.slug)


def _tenant_budget_initial(line) -> dict:
    if line.budget is None:
        return {}
    return {
        "budget_period": line.budget.period,
        "budget_limit_usd": line.budget.limit_microcents / 100_000_000,
        **_soft_initial(line.budget),
    }


@portal_page(Role.ADMIN, write=True)
def tenant_budget_set(request, portal):
    form = TenantBudgetForm(request.POST)
    if form.is_valid():
        period, limit = form.budget()
        try:
            portal_services.agent_budget_set(
                tenant=portal.tenant,
                agent=None,
                period=period,
                limit_microcents=limit,
                soft=form.budget_soft(),
            )
            return redirect("portal:budgets", slug=portal.tenant.slug)
        except InvalidRequest as exc:
            form_error_apply(form, exc, BUDGET_FIELDS)
    return _budgets_page(request, portal, form=form, status=400)
