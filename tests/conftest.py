"""Shared fixtures: two tenants (so every test can check the other one is untouched), an agent,
a key, people with each role, and clients authenticated as them."""

import pytest

import celery_app  # noqa: F401  (tasks sent from tests go to the configured broker)
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tenants.models import Role, Scope
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, member_add, tenant_create


@pytest.fixture
def make_user(db):
    def make(username: str, **extra):
        return get_user_model().objects.create_user(username=username, password="pw-" + username,
                                                    **extra)
    return make


@pytest.fixture
def owner(make_user):
    return make_user("olivia")


@pytest.fixture
def tenant(owner):
    return tenant_create(name="Acme", slug="acme", owner=owner, timezone_name="Europe/Berlin")


@pytest.fixture
def other_owner(make_user):
    return make_user("oscar")


@pytest.fixture
def other_tenant(other_owner):
    return tenant_create(name="Globex", slug="globex", owner=other_owner)


@pytest.fixture
def agent(tenant):
    return agent_create(tenant=tenant, name="support-bot")


@pytest.fixture
def other_agent(other_tenant):
    return agent_create(tenant=other_tenant, name="support-bot")


@pytest.fixture
def api_key(tenant, agent):
    """(key row, plain key) with every scope."""
    return api_key_create(tenant=tenant, agent=agent, name="ci", scopes=list(Scope.values))


@pytest.fixture
def other_api_key(other_tenant, other_agent):
    return api_key_create(tenant=other_tenant, agent=other_agent, scopes=list(Scope.values))


@pytest.fixture
def member_of(make_user):
    """A person with the given role in the tenant."""
    def make(tenant, role: str, username: str | None = None):
        user = make_user(username or f"{role}-{tenant.slug}")
        member_add(tenant=tenant, user=user, role=role, actor_role=Role.OWNER)
        return user
    return make


@pytest.fixture
def client_for():
    """An API client signed in as a person (session) or carrying a key (bearer)."""
    def make(user=None, key: str | None = None, csrf: bool = False):
        client = APIClient(enforce_csrf_checks=csrf)
        if user is not None:
            client.force_login(user)
        if key is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        return client
    return make


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def child_env(**overrides) -> dict:
    """Environment for a child process (worker, server, script) that must use the test
    database; the test database exists once django_db_setup has run."""
    import os

    from django.conf import settings

    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return {**os.environ, "DATABASE_URL": url, "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
            "DJANGO_SETTINGS_MODULE": "settings", "REDIS_URL": settings.REDIS_URL,
            # Tests replace the database's rows between tests, which nothing does in a
            # deployment: a server that outlives one test must not route by its snapshot.
            "FAIRLANE_ROUTING_CACHE_SECONDS": "0",
            # The same for keys and budgets: tests change rows without signals and race the
            # invalidation they publish; tests/routing/test_gateway_processes.py turns it on.
            "FAIRLANE_AUTH_CACHE_SECONDS": "0",
            # Servers pool their connections as deployed; the test process itself does not
            # (`make test` turns it off there: a pool outlives the test database's set-up).
            "FAIRLANE_DB_POOL_SIZE": "16", **overrides}


@pytest.fixture
def subprocess_env(transactional_db):
    """Tests using a child process commit their data (transactional_db) so it can see it."""
    return child_env()


@pytest.fixture(autouse=True)
def _routing_state_fresh():
    """Each test starts with no cached registry and closed circuit breakers in this process
    (a deployment keeps both for the life of the process)."""
    from routing.breaker import breakers
    from routing.router import registry_invalidate

    registry_invalidate()
    breakers.reset()
    yield
    registry_invalidate()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll `predicate` until it returns something truthy (returned), or fail the test."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout:.0f} s")
