from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

import probes

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", probes.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    # The API's documentation is public; everything it documents needs credentials.
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]),
         name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema",
                                                     permission_classes=[AllowAny]),
         name="api-docs"),
    path("api/", include("tenants.apis.urls")),
    path("api/", include("routing.management_urls")),
    path("v1/", include("routing.urls")),
    path("portal/", include("tenants.portal.urls")),
    path("ops/", include("routing.ops.urls")),
    path("", RedirectView.as_view(url="/portal/", permanent=False)),
]

handler404 = "tenants.apis.errors.handler404"
handler500 = "tenants.apis.errors.handler500"
