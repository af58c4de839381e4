import uuid

import pytest

from routing.backend_store import _noted
from routing.bench.fakes import FakeProvider
from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env
from tests.servers import AsgiServer
from workers.serving.registration import model_register
from workers.transport import queue_for

PRICES = {
    "price_input_per_mtok": 10_000_000,
    "price_output_per_mtok": 40_000_000,
    "price_cached_per_mtok": 5_000_000,
}


@pytest.fixture(autouse=True)
def _backend_errors_noted_afresh():
    """Each test's backends start with a clean note throttle: a backend of the same name in an
    earlier test (its database row rolled back) must not mute this test's failure note."""
    _noted.clear()
    yield
    _noted.clear()


@pytest.fixture
def tiny(db):
    """The `tiny` preset, priced like the demo: 10 / 40 / 5 micro-cents per token."""
    return model_register(name="tiny", source="preset:tiny", **PRICES)


@pytest.fixture
def slow(db):
    """The `small` preset (~25 M parameters): slow enough on a CPU that a test can act while it
    is still generating. Same prices as `tiny`."""
    return model_register(name="small", source="preset:small", **PRICES)


@pytest.fixture
def key(tenant, agent, tiny):
    """A plain inference key for `agent` (Acme's support-bot)."""
    return api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]


@pytest.fixture
def queue(settings, distributed):
    """`tiny`'s Redis fair queue in the distributed runtime, in a namespace of its own (no GPU
    worker: a test takes the queue's requests itself)."""
    settings.FAIRLANE_QUEUE_NAMESPACE = f"t{uuid.uuid4().hex[:8]}-"
    q = queue_for(distributed.redis, "tiny")
    yield q
    q.clear()


@pytest.fixture
def budget(tenant, agent):
    return budget_create(tenant=tenant, agent=agent, limit_microcents=10**9)


@pytest.fixture(scope="module")
def embedded_server(django_db_setup, django_db_blocker):
    """uvicorn serving the platform with its engines in-process (the embedded mode)."""
    server = AsgiServer(child_env(FAIRLANE_ENGINE_MODE="embedded"))
    yield server
    server.stop()


@pytest.fixture
def fakes():
    """make(fmt, **options): a fake provider (a real HTTP server), stopped after the test."""
    started: list[FakeProvider] = []

    def make(fmt="openai", **kwargs) -> FakeProvider:
        fake = FakeProvider(fmt, **kwargs).start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()
