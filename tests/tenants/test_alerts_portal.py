"""Budget alerts in the tenant portal: admins set recipients, webhooks (the signing secret is
shown once) and each budget's rules; viewers see what fired but change nothing; another
tenant's members get 404 on every alert URL; a forecast shows as a banner on every page."""

import pytest
from django.test import Client
from django.urls import reverse

from tenants.models import AlertDestination, AlertEvent, AlertRule, Role
from tenants.services.alerts import alert_destination_add
from tenants.services.budgets import budget_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def budget(tenant, agent):
    return budget_create(tenant=tenant, agent=agent, limit_microcents=10**8)


def client_as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def alerts_url(tenant, name="alerts", **ids) -> str:
    return reverse(f"portal:{name}", kwargs={"slug": tenant.slug, **ids})


def test_an_admin_adds_an_email_and_a_webhook_whose_secret_is_shown_once(
    tenant, member_of, settings
):
    settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = False
    client = client_as(member_of(tenant, Role.ADMIN))
    response = client.post(
        alerts_url(tenant, "alert_destination_add"), {"kind": "email", "target": "ops@acme.example"}
    )
    assert response.status_code == 302
    response = client.post(
        alerts_url(tenant, "alert_destination_add"),
        {"kind": "webhook", "target": "https://93.184.215.14/hooks"},
    )
    assert response.status_code == 201 and "no-store" in response["Cache-Control"]
    secret = response.context["secret"]
    assert secret.startswith("whsec_") and secret in response.content.decode()
    page = client.get(alerts_url(tenant)).content.decode()
    assert "ops@acme.example" in page and "https://93.184.215.14/hooks" in page
    assert secret not in page
    assert AlertDestination.objects.filter(tenant=tenant).count() == 2


def test_a_private_webhook_is_refused_with_the_reason_on_the_form(tenant, member_of, settings):
    settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = False
    client = client_as(member_of(tenant, Role.ADMIN))
    response = client.post(
        alerts_url(tenant, "alert_destination_add"),
        {"kind": "webhook", "target": "http://169.254.169.254/latest"},
    )
    assert response.status_code == 400
    assert "not on a public address" in response.content.decode()
    assert not AlertDestination.objects.exists()


def test_an_admin_sets_a_budgets_rules_and_bad_ones_are_explained(tenant, member_of, budget):
    client = client_as(member_of(tenant, Role.ADMIN))
    prefix = f"b{str(budget.pk)[:8]}"
    url = alerts_url(tenant, "alert_rules_save", budget_id=budget.pk)
    assert client.post(url, {f"{prefix}-thresholds": "90, 75"}).status_code == 302
    assert sorted(AlertRule.objects.values_list("kind", "percent")) == [
        ("threshold", 75),
        ("threshold", 90),
    ]
    response = client.post(url, {f"{prefix}-thresholds": "80, lots"})
    assert response.status_code == 400 and "whole percentages" in response.content.decode()
    response = client.post(url, {f"{prefix}-thresholds": "0"})
    assert response.status_code == 400 and "from 1 to 1000" in response.content.decode()
    assert AlertRule.objects.count() == 2


def test_a_viewer_sees_alerts_but_every_change_is_refused(tenant, member_of, budget, agent):
    destination, _ = alert_destination_add(tenant=tenant, kind="email", target="a@acme.example")
    client = client_as(member_of(tenant, Role.VIEWER))
    page = client.get(alerts_url(tenant))
    assert page.status_code == 200 and "a@acme.example" in page.content.decode()
    assert "Add destination" not in page.content.decode()
    posts = [
        (alerts_url(tenant, "alert_destination_add"), {"kind": "email", "target": "b@x.io"}),
        (alerts_url(tenant, "alert_destination_remove", destination_id=destination.pk), {}),
        (
            alerts_url(tenant, "alert_rules_save", budget_id=budget.pk),
            {f"b{str(budget.pk)[:8]}-thresholds": "10"},
        ),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code == 403, url
    assert AlertDestination.objects.count() == 1 and not AlertRule.objects.exists()


def test_every_alert_url_is_a_404_to_another_tenant(tenant, other_owner, budget):
    destination, _ = alert_destination_add(tenant=tenant, kind="email", target="a@acme.example")
    client = client_as(other_owner)
    assert client.get(alerts_url(tenant)).status_code == 404
    for url in (
        alerts_url(tenant, "alert_destination_add"),
        alerts_url(tenant, "alert_destination_remove", destination_id=destination.pk),
        alerts_url(tenant, "alert_rules_save", budget_id=budget.pk),
    ):
        assert client.post(url, {"kind": "email", "target": "x@globex.example"}).status_code == 404
    assert AlertDestination.objects.count() == 1
    assert Client().get(alerts_url(tenant)).status_code == 302  # signed out: sign in


def test_another_tenants_destination_and_budget_are_not_found_here(
    tenant, other_tenant, other_agent, member_of
):
    theirs, _ = alert_destination_add(tenant=other_tenant, kind="email", target="x@globex.io")
    their_budget = budget_create(tenant=other_tenant, agent=other_agent, limit_microcents=100)
    client = client_as(member_of(tenant, Role.OWNER, "own2"))
    assert (
        client.post(
            alerts_url(tenant, "alert_destination_remove", destination_id=theirs.pk)
        ).status_code
        == 404
    )
    assert (
        client.post(
            alerts_url(tenant, "alert_rules_save", budget_id=their_budget.pk), {}
        ).status_code
        == 404
    )
    assert AlertDestination.objects.filter(pk=theirs.pk).exists()


def test_a_forecast_shows_as_a_banner_and_fired_alerts_are_listed(tenant, member_of, budget, agent):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    AlertEvent.objects.create(
        tenant=tenant,
        budget=budget,
        agent=agent,
        event="projected_limit_exceeded",
        rule="forecast",
        period="daily",
        window_start=now - timedelta(hours=1),
        window_end=now + timedelta(hours=5),
        spent_microcents=10,
        limit_microcents=100,
        message="Agent support-bot's daily budget is projected to run out at 15:00.",
        created_at=now,
    )
    client = client_as(member_of(tenant, Role.VIEWER))
    overview = client.get(reverse("portal:overview", kwargs={"slug": tenant.slug}))
    assert "projected to run out at 15:00" in overview.content.decode()
    page = client.get(alerts_url(tenant)).content.decode()
    assert "projected_limit_exceeded" in page and "in-app only" in page
