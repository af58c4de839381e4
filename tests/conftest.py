"""Shared fixtures: two tenants (so every test can check the other one is untouched), an agent,
a key, people with each role, and clients authenticated as them."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tenants.models import Role, Scope
from tenants.services.keys import api_key_create
from tenants.services.portal import playground_key_issue
from tenants.services.tenancy import agent_create, member_add, tenant_create

import celery_app  # noqa: F401  (tasks sent from tests go to the configured broker)

pytest_plugins = ["tests.browser"]  # Debian's chromium for every browser test


@pytest.fixture
def make_user(db):
    def make(username: str, **extra):
        return get_user_model().objects.create_user(
            username=username, password="pw-" + username, **extra
        )

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
    return {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
        "REDIS_URL": settings.REDIS_URL,
        # Tests replace the database's rows between tests, which nothing does in a
        # deployment: a server that outlives one test must not route by its snapshot.
        "FAIRLANE_ROUTING_CACHE_SECONDS": "0",
        # The same for keys and budgets: tests change rows without signals and race the
        # invalidation they publish; tests/routing/test_gateway_processes.py turns it on.
        "FAIRLANE_AUTH_CACHE_SECONDS": "0",
        # Servers pool their connections as deployed; the test process itself does not
        # (`make test` turns it off there: a pool outlives the test database's set-up).
        "FAIRLANE_DB_POOL_SIZE": "16",
        # Tests scrape their servers' /metrics from loopback, as the embedded mode allows
        # (tests/platform/test_probes.py checks each mode's default).
        "FAIRLANE_METRICS_LOOPBACK": "1",
        **overrides,
    }


@pytest.fixture
def subprocess_env(transactional_db):
    """Tests using a child process commit their data (transactional_db) so it can see it."""
    return child_env()


@pytest.fixture(scope="session", autouse=True)
def _no_batch_runner_here():
    """The test process is no API process: importing `asgi` (to drive its application in
    process) must not start a batch runner that advances, for the rest of the session, the
    batches other tests put where they check them. Servers the tests start run theirs."""
    from django.test import override_settings

    with override_settings(FAIRLANE_BATCH_RUNNER=False):
        yield


@pytest.fixture(scope="session", autouse=True)
def process_runtime(django_db_setup, django_db_blocker):
    """The test process's runtime, installed as a process's start-up installs it (from the
    settings: distributed, on the test Redis); tests that need another install theirs."""
    from routing.runtimes import runtime_installed

    with django_db_blocker.unblock():
        return runtime_installed()


@pytest.fixture(scope="session")
def embedded_runtime():
    """One embedded runtime for the session (its engines load once): requests run on this
    process's engines. Install it for a test with the `embedded` fixture."""
    from routing.runtimes import runtime_build

    runtime = runtime_build("embedded")
    yield runtime
    runtime.stop()


@pytest.fixture
def embedded(embedded_runtime):
    """The embedded runtime installed for this test (its requests and sockets use it)."""
    from routing.runtimes import runtime_using

    with runtime_using(embedded_runtime):
        yield embedded_runtime


@pytest.fixture(scope="session")
def distributed_runtime():
    """One distributed runtime for the session, as an API process has it (no engines here:
    GPU worker processes take its requests from the fair queue)."""
    from routing.runtimes import runtime_build

    runtime = runtime_build("distributed")
    yield runtime
    runtime.stop()


@pytest.fixture
def distributed(distributed_runtime):
    from routing.runtimes import runtime_using

    with runtime_using(distributed_runtime):
        yield distributed_runtime


@pytest.fixture(autouse=True)
def _metrics_on_loopback(settings):
    """The test client scrapes /metrics from 127.0.0.1, as the embedded mode allows; the test
    process runs distributed (REDIS_URL), whose default refuses it (test_probes.py)."""
    settings.FAIRLANE_METRICS_LOOPBACK = True


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


def workers_live() -> list[dict]:
    """The live GPU workers' heartbeats, read from the test's Redis as the distributed
    runtime's pool reads them, under every queue namespace (the tests' workers each run under
    a namespace of their own)."""
    import redis
    from django.conf import settings

    from workers.pools import workers_live as heartbeats

    return heartbeats(redis.Redis.from_url(settings.REDIS_URL), namespace="*")


# -- a member and the keys she made (tests/tenants/test_member_keys.py, the portal's page) --


@pytest.fixture
def mia(tenant, make_user):
    user = make_user("mia")
    member_add(tenant=tenant, user=user, role=Role.MEMBER, actor_role=Role.OWNER)
    return user


@pytest.fixture
def mias_keys(tenant, agent, mia, client_for):
    """What the reviewer's member minted, through the management API as herself."""
    client = client_for(user=mia)
    minted = {}
    for name, scopes in (("read", ["management.read"]), ("infer", ["inference"])):
        response = client.post(
            "/api/tenants/acme/keys/",
            {"agent": str(agent.pk), "name": name, "scopes": scopes},
            format="json",
        )
        assert response.status_code == 201, response.content
        minted[name] = response.json()["key"]
    minted["playground"] = playground_key_issue(
        tenant=tenant, agent=agent, user=mia, actor_role=Role.MEMBER
    )[1]
    return minted
