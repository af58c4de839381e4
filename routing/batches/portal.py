"""The portal's batches page (a tenant's batches: progress, cost so far, files; cancel) and
the download of a tenant's file. It lives with the batches, in routing, and is mounted among
the portal's pages by platform/urls.py (tenants imports no other app)."""

from __future__ import annotations

import contextlib

from django.http import FileResponse
from django.shortcuts import redirect

from routing.batch_models import BATCH_FINAL
from routing.batches import services as batch_services
from routing.batches.files import file_get
from routing.batches.storage import files_storage
from tenants.errors import InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.pages import render_page

PAGE_SIZE = 50


@portal_page()
def batch_list(request, portal):
    batches, _ = batch_services.batch_list(tenant=portal.tenant, limit=PAGE_SIZE)
    rows = [
        {
            "batch": batch,
            "done": batch.completed + batch.failed,
            "percent": 100 * (batch.completed + batch.failed) // max(batch.total, 1),
            "cost_usd": batch_services.batch_cost(batch=batch) / 1e8,
            "cancellable": batch.status not in BATCH_FINAL and batch.status != "cancelling",
        }
        for batch in batches
    ]
    return render_page(
        request,
        portal,
        "portal/batches/list.html",
        {"rows": rows, "can_cancel": portal.at_least(Role.MEMBER)},
        section="batches",
    )


@portal_page(Role.MEMBER, write=True)
def batch_cancel(request, portal, batch_id: str):
    """Cancel (a batch already at rest stays as it is: the page shows its state)."""
    with contextlib.suppress(InvalidRequest):
        batch_services.batch_cancel(tenant=portal.tenant, batch_id=batch_id)
    return redirect("portal:batches", slug=portal.tenant.slug)


@portal_page()
def file_download(request, portal, file_id: str):
    row = file_get(tenant=portal.tenant, file_id=file_id)
    return FileResponse(
        files_storage().open(row.storage_name, "rb"), as_attachment=True, filename=row.filename
    )
