"""The portal's URLs, mounted at /portal/. Tenant pages live under t/<slug>/; every action
(a POST) has its own URL so its role check stands on its own."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from tenants.portal.views import (
    agents,
    alerts,
    audit,
    auth,
    identity,
    keys,
    members,
    overview,
    playground,
    request_logs,
    usage,
)

app_name = "portal"

tenant_urls = [
    path("", overview.overview, name="overview"),
    path("figures/", overview.overview_figures, name="overview_figures"),
    path("agents/", agents.agent_list, name="agents"),
    path("agents/new/", agents.agent_create, name="agent_create"),
    path("agents/<uuid:agent_id>/", agents.agent_edit, name="agent_edit"),
    path("agents/<uuid:agent_id>/deactivate/", agents.agent_deactivate, name="agent_deactivate"),
    path("agents/<uuid:agent_id>/routing/", playground.agent_routing, name="agent_routing"),
    path("budgets/", agents.budget_list, name="budgets"),
    path("budgets/tenant/", agents.tenant_budget_set, name="tenant_budget_set"),
    path("budgets/scoped/", agents.scoped_budget_create, name="scoped_budget_create"),
    path(
        "budgets/<uuid:budget_id>/delete/",
        agents.scoped_budget_delete,
        name="scoped_budget_delete",
    ),
    path("keys/", keys.key_list, name="keys"),
    path("keys/new/", keys.key_create, name="key_create"),
    path("keys/<uuid:key_id>/rotate/", keys.key_rotate, name="key_rotate"),
    path("keys/<uuid:key_id>/revoke/", keys.key_revoke, name="key_revoke"),
    path("usage/", usage.usage, name="usage"),
    path("usage.csv", usage.usage_csv, name="usage_csv"),
    path("usage/requests/<str:request_id>/", usage.usage_request, name="usage_request"),
    path("members/", members.member_list, name="members"),
    path("members/add/", members.member_add, name="member_add"),
    path("members/<int:member_id>/role/", members.member_role, name="member_role"),
    path("members/<int:member_id>/remove/", members.member_remove, name="member_remove"),
    path("members/keys-policy/", members.member_keys_policy, name="member_keys_policy"),
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/destinations/", alerts.alert_destination_add, name="alert_destination_add"),
    path(
        "alerts/destinations/<uuid:destination_id>/remove/",
        alerts.alert_destination_remove,
        name="alert_destination_remove",
    ),
    path("alerts/rules/<uuid:budget_id>/", alerts.alert_rules_save, name="alert_rules_save"),
    path("audit/", audit.audit_log, name="audit"),
    path("audit.<str:kind>", audit.audit_export, name="audit_export"),
    path("request-logs/", request_logs.request_log_index, name="request_logs"),
    path("request-logs.jsonl", request_logs.request_log_export, name="request_logs_export"),
    path("request-logs/delete/", request_logs.request_logs_delete, name="request_logs_delete"),
    path(
        "request-logs/<str:request_id>/",
        request_logs.request_log_detail,
        name="request_log_detail",
    ),
    path("identity/", identity.identity, name="identity"),
    path("identity/scim-tokens/", identity.scim_token_create, name="scim_token_create"),
    path(
        "identity/scim-tokens/<uuid:token_id>/revoke/",
        identity.scim_token_revoke,
        name="scim_token_revoke",
    ),
    path("identity/sso-only/", identity.sso_only_set, name="sso_only_set"),
    path("playground/", playground.playground, name="playground"),
    path("playground/key/", playground.playground_key, name="playground_key"),
]

urlpatterns = [
    path("", auth.home, name="home"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/change/", auth.PasswordChangeView.as_view(), name="password_change"),
    path(
        "password/change/done/", auth.PasswordChangeDoneView.as_view(), name="password_change_done"
    ),
    path("password/reset/", auth.PasswordResetView.as_view(), name="password_reset"),
    path("password/reset/sent/", auth.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path(
        "password/reset/<uidb64>/<token>/",
        auth.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "password/reset/done/",
        auth.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("t/<slug:slug>/", include(tenant_urls)),
]
