from django.urls import path

from tenants.apis import views

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("tenants/", views.TenantListView.as_view(), name="tenant-list"),
    path("tenants/<slug:slug>/", views.TenantDetailView.as_view(), name="tenant-detail"),
    path("tenants/<slug:slug>/members/", views.MemberListView.as_view(), name="member-list"),
    path(
        "tenants/<slug:slug>/members/<int:member_id>/",
        views.MemberDetailView.as_view(),
        name="member-detail",
    ),
    path("tenants/<slug:slug>/agents/", views.AgentListView.as_view(), name="agent-list"),
    path(
        "tenants/<slug:slug>/agents/<uuid:agent_id>/",
        views.AgentDetailView.as_view(),
        name="agent-detail",
    ),
    path("tenants/<slug:slug>/keys/", views.KeyListView.as_view(), name="key-list"),
    path(
        "tenants/<slug:slug>/keys/<uuid:key_id>/", views.KeyDetailView.as_view(), name="key-detail"
    ),
    path(
        "tenants/<slug:slug>/keys/<uuid:key_id>/rotate/",
        views.KeyRotateView.as_view(),
        name="key-rotate",
    ),
    path("tenants/<slug:slug>/budgets/", views.BudgetListView.as_view(), name="budget-list"),
    path(
        "tenants/<slug:slug>/budgets/<uuid:budget_id>/",
        views.BudgetDetailView.as_view(),
        name="budget-detail",
    ),
    path("tenants/<slug:slug>/usage/", views.UsageListView.as_view(), name="usage-list"),
    path(
        "tenants/<slug:slug>/usage/summary/", views.UsageSummaryView.as_view(), name="usage-summary"
    ),
]
