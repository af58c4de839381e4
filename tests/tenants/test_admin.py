"""The operators' admin: every page needs a staff login; a key made there is shown once."""

import re

import pytest

from tenants.models import ApiKey, Scope
from tenants.services.keys import api_key_authenticate


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    return client


def test_admin_pages_need_a_staff_login(client, owner, api_key):
    assert client.get("/admin/tenants/apikey/").status_code == 302
    client.force_login(owner)  # a tenant owner is not an operator
    response = client.get("/admin/tenants/apikey/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_admin_lists_every_model_page(admin_client, api_key):
    for page in [
        "tenant",
        "agent",
        "apikey",
        "budget",
        "budgetwindow",
        "reservation",
        "usagerecord",
    ]:
        assert admin_client.get(f"/admin/tenants/{page}/").status_code == 200, page


def test_admin_creates_a_key_through_the_service_and_shows_it_once(admin_client, agent):
    form = admin_client.get("/admin/tenants/apikey/add/")
    assert form.status_code == 200 and b"csrfmiddlewaretoken" in form.content
    response = admin_client.post(
        "/admin/tenants/apikey/add/",
        {"agent": str(agent.pk), "name": "from admin", "scopes": [Scope.INFERENCE]},
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    plain = re.search(r'<pre id="new-api-key"[^>]*>(fl-[^<]+)</pre>', response.content.decode())[1]
    key = api_key_authenticate(plain=plain)
    assert key.name == "from admin" and key.tenant_id == agent.tenant_id
    change = admin_client.get(f"/admin/tenants/apikey/{key.pk}/change/")
    assert plain not in change.content.decode() and key.prefix in change.content.decode()


def test_admin_revoke_action_stops_the_key(admin_client, api_key):
    key, plain = api_key
    admin_client.post(
        "/admin/tenants/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]}
    )
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert ApiKey.objects.get(pk=key.pk).is_usable_at(key.revoked_at) is False


def test_ledger_pages_are_read_only(admin_client):
    assert admin_client.get("/admin/tenants/usagerecord/add/").status_code == 403
