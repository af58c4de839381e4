import pytest

from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from workers.serving.registration import model_register

# 10 / 40 / 5 micro-cents per input / output / cached token, as the demo.
PRICES = {
    "price_input_per_mtok": 10_000_000,
    "price_output_per_mtok": 40_000_000,
    "price_cached_per_mtok": 5_000_000,
}
# A chat whose worst case is about 1,900 micro-cents (prompt ~30 tokens, 32 completion
# tokens at most, all generated: ignore_eos).
CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "tell me a story"}],
    "max_tokens": 32,
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
def chaos_key(tenant, agent):
    """An inference key whose agent's daily budget covers about 70 of the 100 requests, so
    budget refusals happen under the chaos too. A budget on the key and one on the model
    `tiny` (both above the agent's) are held too: every request takes four windows, and
    reconciliation checks the extra ones after the chaos."""
    model_register(name="tiny", source="preset:tiny", **PRICES)
    model_register(name="small", source="preset:small", **PRICES)
    budget_create(tenant=tenant, agent=agent, limit_microcents=130_000)
    budget_create(tenant=tenant, limit_microcents=10**9)
    key, plain = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    budget_create(tenant=tenant, api_key=key, limit_microcents=150_000)
    budget_create(tenant=tenant, model_names=["tiny"], limit_microcents=160_000)
    return plain
