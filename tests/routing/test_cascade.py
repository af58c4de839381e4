"""Cascades that cannot fail every request: a cascade is checked when it is written, a tier
that cannot answer a request escalates, and a budget-aware cascade never pays more because the
budget could not cover less (fake providers that are real HTTP servers)."""

import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.models import Backend
from tenants.errors import ApplicationError
from tenants.models import UsageRecord
from tenants.services.budgets import budget_create

pytestmark = pytest.mark.django_db(transaction=True)
CHEAP = {"price_input_per_mtok": 1_000_000, "price_output_per_mtok": 1_000_000}
PRICEY = {"price_input_per_mtok": 100_000_000, "price_output_per_mtok": 100_000_000}
KIND = {"openai": "openai", "anthropic": "anthropic"}


def register(name, fake, model, prices):
    backend = backend_register(
        name=name, kind=KIND[fake.fmt], base_url=fake.url, credential=fake.api_key
    )
    backend_model_set(backend=backend, model=model, upstream_name="fake-model", **prices)
    return backend


def chat(key, model="big"):
    body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    return AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_a_cascade_is_checked_when_it_is_written(agent, fakes):
    register("claude", fakes("anthropic"), "small", CHEAP)
    register("gpt", fakes("openai"), "big", PRICEY)
    for cascade, status in (
        (["small", "big"], 400),
        (["big", "nowhere"], 404),
        (["big", "big"], 400),
    ):
        with pytest.raises(ApplicationError) as exc_info:
            agent_routing_set(agent=agent, cascade=cascade)
        assert (exc_info.value.param, exc_info.value.status) == ("cascade", status)
    agent_routing_set(agent=agent, cascade=["big", "small"])  # the last tier is never scored


async def test_a_tier_that_cannot_answer_escalates_instead_of_failing(key, agent, fakes):
    claude, logprobs, best = fakes("anthropic"), fakes("openai"), fakes("openai")
    await database_sync_to_async(register)("claude", claude, "small", CHEAP)
    await database_sync_to_async(register)("scored", logprobs, "small", CHEAP)
    await database_sync_to_async(register)("best", best, "big", PRICEY)
    await database_sync_to_async(agent_routing_set)(
        agent=agent, cascade=["small", "big"], cascade_threshold=-1.0
    )
    # Later the operator takes away the tier's only backend with log-probabilities.
    await database_sync_to_async(Backend.objects.filter(name="scored").update)(is_enabled=False)
    response = await chat(key)
    assert response.status_code == 200, response.content
    assert response["x-fairlane-backend"] == "best"
    assert claude.stats["requests"] == 0 and best.stats["ok"] == 1


async def test_a_tier_refused_for_budget_ends_the_cascade_with_the_answer_paid_for(
    key, tenant, agent, fakes
):
    cheap, pricey = fakes("openai"), fakes("openai")
    cheap.logprob = -3.0  # below the threshold: it would escalate
    await database_sync_to_async(register)("cheap", cheap, "small", CHEAP)
    await database_sync_to_async(register)("pricey", pricey, "big", PRICEY)
    await database_sync_to_async(agent_routing_set)(
        agent=agent, cascade=["small", "big"], cascade_threshold=-1.0
    )
    # Room for the cheap tier's worst case, not for the pricey one's.
    await database_sync_to_async(budget_create)(tenant=tenant, agent=agent, limit_microcents=500)
    response = await chat(key)
    assert response.status_code == 200, response.content
    assert response["x-fairlane-cascade"] == "small; mean_logprob=-3.0000; escalation=budget"
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 "
    assert pricey.stats["requests"] == 0
    [row] = await database_sync_to_async(list)(UsageRecord.objects.all())
    assert row.backend == "cheap"  # the answer the client got is the one it paid for


async def test_a_budget_that_cannot_cover_the_cheapest_tier_is_a_429_without_escalation(
    key, tenant, agent, fakes
):
    cheap, pricey = fakes("openai"), fakes("openai")
    await database_sync_to_async(register)("cheap", cheap, "small", CHEAP)
    await database_sync_to_async(register)("pricey", pricey, "big", PRICEY)
    await database_sync_to_async(agent_routing_set)(agent=agent, cascade=["small", "big"])
    await database_sync_to_async(budget_create)(tenant=tenant, agent=agent, limit_microcents=1)
    response = await chat(key)
    assert response.status_code == 429
    assert json.loads(response.content)["error"]["code"] == "budget_exhausted"
    assert cheap.stats["requests"] == pricey.stats["requests"] == 0
