"""Request logs (admins): whether the tenant keeps the prompt and answer of its requests, for
how long and redacted how; the kept requests, one at a time with their content, an export
(JSON Lines), and deleting them all (audited). Only the tenant's own logs: another tenant's
do not exist here."""

import json

from django.core.paginator import Paginator
from django.http import StreamingHttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.cache import never_cache

from tenants.errors import InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.forms import RequestLogPolicyForm, form_error_apply
from tenants.portal.pages import render_page
from tenants.services import request_logs

PAGE_SIZE = 50


def _policy_form(policy) -> RequestLogPolicyForm:
    return RequestLogPolicyForm(
        initial={
            "enabled": policy.enabled,
            "retention_days": policy.retention_days,
            "redact_emails": policy.redact_emails,
            "redact_numbers": policy.redact_numbers,
        }
    )


def _count(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@never_cache
@portal_page(Role.ADMIN, form=True)
def request_log_index(request, portal):
    tenant = portal.tenant
    status = 200
    if request.method == "POST":
        form = RequestLogPolicyForm(request.POST)
        if form.is_valid():
            try:
                request_logs.request_log_policy_set(tenant=tenant, **form.cleaned_data)
                return redirect("portal:request_logs", slug=tenant.slug)
            except InvalidRequest as exc:
                form_error_apply(form, exc)
        status = 400
    else:
        form = _policy_form(request_logs.request_log_policy_get(tenant=tenant))
    page = Paginator(request_logs.request_log_list(tenant=tenant), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render_page(
        request,
        portal,
        "portal/request_logs/index.html",
        {"form": form, "page": page, "deleted": _count(request.GET.get("deleted"))},
        section="request_logs",
        status=status,
    )


def _shown(value) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    return json.dumps(value, indent=2, ensure_ascii=False)


@never_cache
@portal_page(Role.ADMIN)
def request_log_detail(request, portal, request_id: str):
    log = request_logs.request_log_get(tenant=portal.tenant, request_id=request_id)
    content = request_logs.request_log_content(log)
    messages = [
        {
            "role": m.get("role", ""),
            "content": _shown(m.get("content")),
            "tool_calls": _shown(m.get("tool_calls")),
        }
        for m in content.get("messages") or []
    ]
    return render_page(
        request,
        portal,
        "portal/request_logs/detail.html",
        {
            "log": log,
            "content": content,
            "messages": messages,
            "prompt": _shown(content.get("prompt")),
            "tools": _shown(content.get("tools")),
            "output": [
                {**c, "tool_calls": _shown(c.get("tool_calls"))} for c in content.get("output", [])
            ],
        },
        section="request_logs",
    )


@portal_page(Role.ADMIN)
def request_log_export(request, portal):
    response = StreamingHttpResponse(
        request_logs.request_logs_jsonl(tenant=portal.tenant),
        content_type="application/jsonl; charset=utf-8",
    )
    response["Content-Disposition"] = (
        f'attachment; filename="request-logs-{portal.tenant.slug}-'
        f'{timezone.now():%Y%m%d-%H%M}.jsonl"'
    )
    response["Cache-Control"] = "no-store"
    return response


@portal_page(Role.ADMIN, write=True)
def request_logs_delete(request, portal):
    deleted = request_logs.request_logs_delete_all(tenant=portal.tenant)
    response = redirect("portal:request_logs", slug=portal.tenant.slug)
    response["Location"] += f"?deleted={deleted}"
    return response
