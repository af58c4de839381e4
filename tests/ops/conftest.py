"""Fixtures of the ops tests: the routing tests' model, key and budget, a staff person and a
fresh namespace for what the processes share in Redis."""

import uuid

import pytest

# The routing tests' model, key and budget.
from tests.routing.conftest import budget, key, tiny  # noqa: F401  (fixtures)


@pytest.fixture
def namespace(settings):
    """A Redis key prefix of this test's own (queues, shared counts, published breakers)."""
    settings.FAIRLANE_QUEUE_NAMESPACE = f"t{uuid.uuid4().hex[:8]}-"
    return settings.FAIRLANE_QUEUE_NAMESPACE


@pytest.fixture
def staff(make_user):
    return make_user("sam", is_staff=True)
