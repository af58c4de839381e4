"""The backend registry in the admin: the credential is typed once, stored encrypted, and
never shown again."""

import pytest

from routing.credentials import credential_resolve
from routing.models import Backend

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("op", "op@x.test", "pw"))
    return client


def test_every_routing_admin_page_renders(admin_client, agent):
    for page in ("backend", "backend/add", "agentrouting", "agentrouting/add"):
        assert admin_client.get(f"/admin/routing/{page}/").status_code == 200, page


def test_a_credential_typed_in_the_admin_is_stored_encrypted_and_never_shown(admin_client):
    response = admin_client.post(
        "/admin/routing/backend/add/",
        {
            "name": "oai",
            "kind": "openai",
            "base_url": "https://api.openai.com",
            "credential": "sk-typed-once",
            "credential_ref": "",
            "context_length": 0,
            "accelerator": "gpu",
            "max_concurrency": 0,
            "energy_mj_per_token": 0,
            "carbon_g_per_kwh": 0,
            "lease_seconds": 0,
            "queue_depth": 0,
            "timeout_seconds": 60,
            "is_enabled": "on",
            "health": "unknown",
            "probe_p50_ms": 0,
            "probe_p95_ms": 0,
            "probe_error_rate": 0,
            "zone": "",
            "models-TOTAL_FORMS": 1,
            "models-INITIAL_FORMS": 0,
            "models-0-model": "gpt",
            "models-0-upstream_name": "gpt-4o-mini",
            "models-0-price_input_per_mtok": 15_000_000,
            "models-0-price_output_per_mtok": 60_000_000,
            "models-0-price_cached_per_mtok": 0,
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    backend = Backend.objects.get(name="oai")
    assert "sk-typed-once" not in backend.credential_encrypted
    assert (
        credential_resolve(ref="", encrypted=backend.credential_encrypted, backend="oai")
        == "sk-typed-once"
    )
    assert backend.models.get().upstream_name == "gpt-4o-mini"
    page = admin_client.get(f"/admin/routing/backend/{backend.pk}/change/").content.decode()
    assert "sk-typed-once" not in page and backend.credential_encrypted not in page
    assert admin_client.get("/admin/routing/backend/").status_code == 200


def test_a_malformed_credential_reference_is_refused(admin_client):
    response = admin_client.post(
        "/admin/routing/backend/add/",
        {
            "name": "bad",
            "kind": "openai",
            "base_url": "https://x.test",
            "credential_ref": "KEY",
            "timeout_seconds": 60,
            "accelerator": "gpu",
            "health": "unknown",
            "models-TOTAL_FORMS": 0,
            "models-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200 and "env:VARIABLE_NAME" in response.content.decode()
    assert not Backend.objects.exists()
