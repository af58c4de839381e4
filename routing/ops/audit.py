"""The platform's audit log for operators: every tenant's records and the platform's own
(backends, models, trusted keys, accounts), filtered like the portal's, exported whole."""

from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render

from routing.ops.access import staff_page
from tenants.portal.views.audit import audit_export_response
from tenants.reports import audit as reports


@staff_page()
def audit_log(request):
    form, data = reports.audit_query(request.GET)
    page = Paginator(reports.audit_records_platform(data=data), reports.PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "ops/audit.html",
        {
            "form": form,
            "page": page,
            "show_tenant": True,
            "query_string": query.urlencode(),
            "section": "audit",
        },
    )


@staff_page()
def audit_export(request, kind: str):
    if kind not in ("jsonl", "csv"):
        raise Http404("Export as audit.jsonl or audit.csv.")
    _, data = reports.audit_query(request.GET)
    return audit_export_response(
        reports.audit_records_platform(data=data), kind=kind, name="platform"
    )
