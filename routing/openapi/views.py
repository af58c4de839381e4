"""The /v1 document, public like /api/schema/ (everything it describes needs a key), and its
Swagger UI page (drf-spectacular's, from the vendored sidecar)."""

from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from routing.openapi import document
from routing.wire.render import json_bytes


@require_GET
def openapi_json(request) -> HttpResponse:
    return HttpResponse(json_bytes(document()), content_type="application/json")


swagger_ui = SpectacularSwaggerView.as_view(url_name="v1-openapi", permission_classes=[AllowAny])
