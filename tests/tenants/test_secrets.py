"""A key's secret appears in the creation response and nowhere else: not in logs (at DEBUG, SQL
included), not in admin pages, not in any later API response, not in a database dump."""

import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from tenants.models import ApiKey


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw")


def test_secret_never_appears_after_creation(client_for, owner, tenant, agent, superuser, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django")  # Django's own default is INFO
    connection.force_debug_cursor = True  # log every SQL statement with its parameters
    try:
        people = client_for(user=owner)
        created = people.post(
            "/api/tenants/acme/keys/",
            {"agent": str(agent.pk), "scopes": ["inference", "management.read"]},
            format="json",
        )
        assert created.status_code == 201
        plain = created.json()["key"]
        secret = plain.rsplit("-", 1)[1]
        key = ApiKey.objects.get()

        seen = []
        program = client_for(key=plain)
        seen += [
            program.get("/api/me/"),
            program.get("/api/tenants/acme/keys/"),
            program.get(f"/api/tenants/acme/keys/{key.pk}/"),
            program.post("/api/tenants/acme/agents/", {"name": "x"}, format="json"),
            client_for(key=plain[:-2] + "zz").get("/api/me/"),
        ]
        rotated = people.post(f"/api/tenants/acme/keys/{key.pk}/rotate/", {}, format="json")
        seen += [
            people.get("/api/tenants/acme/keys/"),
            people.get("/api/tenants/acme/usage/"),
            people.delete(f"/api/tenants/acme/keys/{key.pk}/"),
            program.get("/api/me/"),
        ]
        admin = client_for(user=superuser)
        seen += [
            admin.get("/admin/tenants/apikey/"),
            admin.get(f"/admin/tenants/apikey/{key.pk}/change/"),
            admin.get(f"/admin/tenants/apikey/?q={key.key_id}"),
            admin.get("/admin/tenants/agent/"),
            admin.get("/admin/tenants/reservation/"),
        ]
        for response in seen:
            assert response.status_code < 500
            assert secret not in response.content.decode()
            assert key.secret_hash not in response.content.decode()
        assert secret not in rotated.content.decode()

        dump = StringIO()
        call_command("dumpdata", stdout=dump)
        assert key.prefix in dump.getvalue() or key.key_id in dump.getvalue()
        assert secret not in dump.getvalue()
    finally:
        connection.force_debug_cursor = False
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "api key created: " + key.prefix in logged  # logging happened: the check is real
    assert any(r.name == "django.db.backends" for r in caplog.records)
    assert secret not in logged
