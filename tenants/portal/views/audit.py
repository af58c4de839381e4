"""The tenant's audit log (admins and owners): every change to its keys, budgets, alerts,
members, agents, routing and settings, who made it and from where, filtered in the URL, and
exported as JSON Lines or CSV. Only the tenant's own records: another tenant's do not exist
here."""

from django.core.paginator import Paginator
from django.http import Http404, StreamingHttpResponse
from django.utils import timezone

from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.pages import render_page
from tenants.reports import audit as reports


def audit_export_response(records, *, kind: str, name: str) -> StreamingHttpResponse:
    stream = reports.jsonl_stream(records) if kind == "jsonl" else reports.csv_stream(records)
    content_type = (
        "application/jsonl; charset=utf-8" if kind == "jsonl" else "text/csv; charset=utf-8"
    )
    response = StreamingHttpResponse(stream, content_type=content_type)
    response["Content-Disposition"] = (
        f'attachment; filename="audit-{name}-{timezone.now():%Y%m%d-%H%M}.{kind}"'
    )
    response["Cache-Control"] = "no-store"
    return response


@portal_page(Role.ADMIN)
def audit_log(request, portal):
    form, data = reports.audit_query(request.GET)
    records = reports.audit_records(tenant=portal.tenant, data=data)
    page = Paginator(records, reports.PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render_page(
        request,
        portal,
        "portal/audit/index.html",
        {"form": form, "page": page, "query_string": query.urlencode()},
        section="audit",
    )


@portal_page(Role.ADMIN)
def audit_export(request, portal, kind: str):
    if kind not in ("jsonl", "csv"):
        raise Http404("Export as audit.jsonl or audit.csv.")
    _, data = reports.audit_query(request.GET)
    return audit_export_response(
        reports.audit_records(tenant=portal.tenant, data=data), kind=kind, name=portal.tenant.slug
    )
