"""The ops dashboard's URLs, mounted at /ops/ (staff only)."""

from django.urls import path

from routing.ops import audit, views

app_name = "ops"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("panels/<slug:name>/", views.panel, name="panel"),
    path("tenants/<slug:slug>/", views.tenant, name="tenant"),
    path("requests/", views.request_lookup, name="requests"),
    path("alerts/", views.alert_settings, name="alerts"),
    path("audit/", audit.audit_log, name="audit"),
    path("audit.<str:kind>", audit.audit_export, name="audit_export"),
    path("alerts/destinations/", views.alert_destination_add, name="alert_destination_add"),
    path(
        "alerts/destinations/<uuid:destination_id>/remove/",
        views.alert_destination_remove,
        name="alert_destination_remove",
    ),
]
