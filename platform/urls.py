from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from routing.batches import portal as batch_portal
from routing.openapi.views import openapi_json, swagger_ui
from tenants.portal import urls as portal_urls

import probes

# The portal's pages, with those of apps tenants may not import (the batches, in routing).
portal_patterns = [
    *portal_urls.urlpatterns,
    path("t/<slug:slug>/batches/", batch_portal.batch_list, name="batches"),
    path(
        "t/<slug:slug>/batches/<str:batch_id>/cancel/",
        batch_portal.batch_cancel,
        name="batch_cancel",
    ),
    path("t/<slug:slug>/files/<str:file_id>/", batch_portal.file_download, name="file_download"),
]

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", probes.metrics, name="metrics"),
    # Browsers ask every site for it, the admin's pages included.
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.ico"), permanent=True)),
    path("admin/", admin.site.urls),
    # The API's documentation is public; everything it documents needs credentials.
    path(
        "api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="api-schema"
    ),
    path("api/docs/v1/", swagger_ui, name="v1-docs"),
    path("v1/openapi.json", openapi_json, name="v1-openapi"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[AllowAny]),
        name="api-docs",
    ),
    path("api/", include("tenants.apis.urls")),
    path("api/", include("routing.management_urls")),
    path("v1/", include("routing.urls")),
    path("portal/", include((portal_patterns, portal_urls.app_name))),
    path("ops/", include("routing.ops.urls")),
    path("scim/v2/", include("django_scim.urls", namespace="scim")),
    path("oidc/", include("tenants.sso.urls")),
    path("", RedirectView.as_view(url="/portal/", permanent=False)),
]

handler404 = "tenants.apis.errors.handler404"
handler500 = "tenants.apis.errors.handler500"
