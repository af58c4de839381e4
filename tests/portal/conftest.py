"""Portal fixtures: people with each role in Acme, a signed-in Django test client for each,
and the failed-sign-in counters cleared (they live in the shared cache)."""

import pytest
from django.core.cache import cache
from django.test import Client

from tenants.models import Role


@pytest.fixture
def portal_client(member_of, tenant):
    """portal_client(role) -> (client signed in as a person with that role in Acme, user)."""

    def make(role: str = Role.ADMIN, *, csrf: bool = False, username: str | None = None):
        user = (
            tenant.memberships.get(role=Role.OWNER).user
            if role == Role.OWNER
            else member_of(tenant, role, username)
        )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client, user

    return make


@pytest.fixture(autouse=True)
def _login_counters_clear():
    from tenants.signin import PREFIX

    def clear():
        redis = getattr(cache, "_cache", None)
        if redis is not None and hasattr(redis, "get_client"):
            client = redis.get_client(None, write=True)
            keys = list(client.scan_iter(match=f"*{PREFIX}*"))
            if keys:
                client.delete(*keys)
        else:
            cache.clear()

    clear()
    yield
    clear()
