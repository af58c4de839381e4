from django.urls import path

from routing import management_apis as views

urlpatterns = [
    path("backends/", views.BackendListView.as_view(), name="backend-list"),
    path(
        "tenants/<slug:slug>/agents/<uuid:agent_id>/routing/",
        views.AgentRoutingView.as_view(),
        name="agent-routing",
    ),
]
