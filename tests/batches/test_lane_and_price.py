"""A batch's line is an ordinary request of its agent, on the bulk lane whatever the agent's
own lane (so the fair queue serves interactive lanes first: tests/workers/test_fairqueue.py),
at its model's prices less the batch discount (per model, else the default)."""

import pytest

from routing.admission import Caller
from routing.router import registry_get
from routing.runtimes import runtime_build
from routing.services.prepare import Routed, batch_priced
from tenants.models import ApiKey, Lane, Scope
from tenants.services.keys import api_key_create
from tests.routing.conftest import PRICES
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db


@pytest.fixture
def caller(tenant, agent):
    model_register(name="tiny", source="preset:tiny", **PRICES)
    agent.lane = Lane.REALTIME
    agent.save()
    key, _ = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    return Caller(api_key=ApiKey.objects.get(pk=key.pk), tenant=tenant, agent=agent)


def test_a_batch_line_runs_on_the_bulk_lane_under_its_own_request_id(caller):
    runtime = runtime_build("embedded", redis_url="")
    assert Routed(runtime, caller, "tiny").lane == Lane.REALTIME
    line = Caller(
        api_key=caller.api_key,
        tenant=caller.tenant,
        agent=caller.agent,
        batch_id="batch_x",
        request_id="batch_x-abc-1",
    )
    routed = Routed(runtime, line, "tiny")
    assert routed.lane == Lane.BULK and routed.request_id == "batch_x-abc-1"


def test_the_batch_price_is_the_models_less_its_discount(caller, settings):
    route = registry_get().routes["tiny"][0]
    assert batch_priced(route).info.price_output_per_mtok == PRICES["price_output_per_mtok"] // 2
    settings.FAIRLANE_BATCH_DISCOUNTS = {"tiny": 30}
    priced = batch_priced(route).info
    assert priced.price_input_per_mtok == PRICES["price_input_per_mtok"] * 70 // 100
    assert priced.price_cached_per_mtok == PRICES["price_cached_per_mtok"] * 70 // 100
    settings.FAIRLANE_BATCH_DISCOUNTS = {"tiny": 0}
    assert batch_priced(route).info.price_output_per_mtok == PRICES["price_output_per_mtok"]
