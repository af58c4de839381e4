"""Routing decisions on hand-built registries: what each policy puts first, what capability,
health and circuit state remove, and the snapshot read from real database rows."""

import pytest

from routing.backend_store import backend_model_set, backend_register
from routing.backends.base import BackendSpec, Route
from routing.breaker import breakers
from routing.models import Backend, Health
from routing.router import (
    AgentPlan,
    BackendRegistry,
    Need,
    registry_get,
    registry_load,
    route_plan,
    route_supports,
)
from workers.serving.catalog import ModelInfo
from workers.serving.registration import model_register

CHAT = Need(endpoint="chat", prompt_tokens=40, max_tokens=10)
AGENT = "agent-1"


def spec(name: str, kind: str = "openai_compatible", **fields) -> BackendSpec:
    return BackendSpec(name=name, kind=kind, base_url=f"http://{name}.invalid", **fields)


def route(backend: BackendSpec, model: str = "m", **prices) -> Route:
    info = ModelInfo(name=model, source=f"backend:{backend.name}", **prices)
    return Route(backend=backend, model=model, upstream=f"{backend.name}-{model}", info=info)


def registry(
    *backends: BackendSpec, agents: dict | None = None, **prices_by_name
) -> BackendRegistry:
    """Every backend serves model "m"; prices per backend name as a dict of price fields."""
    return BackendRegistry(
        backends={b.name: b for b in backends},
        routes={"m": [route(b, **prices_by_name.get(b.name, {})) for b in backends]},
        agents=agents or {},
    )


def order(
    reg: BackendRegistry,
    *,
    need: Need = CHAT,
    policy: str | None = None,
    agent_id: str = AGENT,
    model: str = "m",
) -> list[str]:
    plan = route_plan(registry=reg, agent_id=agent_id, model=model, need=need, policy=policy)
    return [r.backend.name for r in plan.routes]


# -- default and chain order -------------------------------------------------------------------


def test_default_order_is_by_kind_then_name_and_the_agent_chain_overrides_it():
    backends = [
        spec("a-openai", "openai"),
        spec("b-anthropic", "anthropic"),
        spec("c-openrouter", "openrouter"),
        spec("d-compat", "openai_compatible"),
        spec("e-fairlane", "fairlane"),
        spec("z-local", "local"),
    ]
    reg = registry(*backends)
    assert order(reg) == [
        "z-local",
        "e-fairlane",
        "d-compat",
        "c-openrouter",
        "b-anthropic",
        "a-openai",
    ]

    reg.agents[AGENT] = AgentPlan(chain=("a-openai", "c-openrouter", "z-local"))
    assert order(reg) == ["a-openai", "c-openrouter", "z-local"]  # the others are not tried
    assert order(reg, agent_id="another-agent")[0] == "z-local"  # its own (default) order


def test_a_chain_naming_no_backend_of_the_model_gives_an_empty_plan_not_unsupported():
    reg = registry(spec("a"), spec("b"), agents={AGENT: AgentPlan(chain=("elsewhere",))})
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=CHAT)
    assert plan.routes == [] and not plan.unsupported
    assert route_plan(registry=reg, agent_id=AGENT, model="nope", need=CHAT).routes == []


def test_the_agent_policy_applies_unless_the_caller_names_one():
    reg = registry(
        spec("a", energy_mj_per_token=500),
        spec("b", energy_mj_per_token=100),
        agents={AGENT: AgentPlan(policy="energy")},
    )
    assert order(reg) == ["b", "a"]
    assert order(reg, policy="chain") == ["a", "b"]


# -- policies ----------------------------------------------------------------------------------


def test_cost_orders_by_the_worst_case_price_of_this_need():
    # "in-cheap" charges little for input, much for output; "out-cheap" the other way round.
    reg = registry(
        spec("in-cheap"),
        spec("out-cheap"),
        **{
            "in-cheap": {"price_input_per_mtok": 1_000_000, "price_output_per_mtok": 10_000_000},
            "out-cheap": {
                "price_input_per_mtok": 5_000_000,
                "price_output_per_mtok": 2_000_000,
                "price_cached_per_mtok": 0,
            },
        },
    )
    # 1000 in + 100 out: 1000 + 1000 vs 5000 + 200 micro-cents.
    assert order(reg, policy="cost", need=Need("chat", prompt_tokens=1000, max_tokens=100)) == [
        "in-cheap",
        "out-cheap",
    ]
    # The same prompt, ten times the output: 1000 + 10000 vs 5000 + 2000.
    assert order(reg, policy="cost", need=Need("chat", prompt_tokens=1000, max_tokens=1000)) == [
        "out-cheap",
        "in-cheap",
    ]
    # n choices are n times the output (the prompt is paid once): 1000 + 50000 vs 5000 + 10000.
    assert order(
        reg, policy="cost", need=Need("chat", prompt_tokens=1000, max_tokens=100, n=50)
    ) == ["out-cheap", "in-cheap"]


def test_cost_ignores_the_cached_price_because_the_worst_case_has_no_cache_hit():
    reg = registry(
        spec("a"),
        spec("b"),
        a={"price_input_per_mtok": 3_000_000, "price_cached_per_mtok": 0},
        b={"price_input_per_mtok": 2_000_000, "price_cached_per_mtok": 2_000_000},
    )
    assert order(reg, policy="cost", need=Need("chat", prompt_tokens=1000)) == ["b", "a"]


def test_energy_orders_by_millijoules_per_token_with_unknown_last():
    reg = registry(
        spec("a", energy_mj_per_token=300),
        spec("b", energy_mj_per_token=0),
        spec("c", energy_mj_per_token=100),
        spec("d", energy_mj_per_token=200),
    )
    assert order(reg, policy="energy") == ["c", "d", "a", "b"]


def test_carbon_orders_by_energy_times_grid_intensity_with_unknown_last():
    reg = registry(
        spec("frugal-dirty", energy_mj_per_token=100, carbon_g_per_kwh=500),  # 50 000
        spec("hungry-clean", energy_mj_per_token=300, carbon_g_per_kwh=100),  # 30 000
        spec("no-grid-data", energy_mj_per_token=50, carbon_g_per_kwh=0),
        spec("no-energy-data", energy_mj_per_token=0, carbon_g_per_kwh=10),
        spec("middle", energy_mj_per_token=200, carbon_g_per_kwh=200),
    )  # 40 000
    names = order(reg, policy="carbon")
    assert names[:3] == ["hungry-clean", "middle", "frugal-dirty"]
    assert set(names[3:]) == {"no-grid-data", "no-energy-data"}
    assert order(reg, policy="energy")[0] == "no-grid-data"  # energy alone would differ


def test_latency_orders_by_rolling_p95_and_falls_back_to_the_probe_p95():
    reg = registry(
        spec("a-spiky", probe_p95_ms=10.0),
        spec("b-steady", probe_p95_ms=5000.0),
        spec("c-probed", probe_p95_ms=300.0),
        spec("d-fast", probe_p95_ms=9000.0),
    )
    for _ in range(19):
        breakers.success("a-spiky", 10.0)
    breakers.success("a-spiky", 900.0)  # a low mean, a high tail: p95 is 900
    for _ in range(20):
        breakers.success("b-steady", 100.0)
        breakers.success("d-fast", 50.0)
    # Seen samples win over the probe's figure; c has only its probe's 300 ms.
    assert order(reg, policy="latency") == ["d-fast", "b-steady", "c-probed", "a-spiky"]


def test_least_busy_orders_by_requests_in_flight_relative_to_capacity():
    reg = registry(
        spec("a", max_concurrency=10),
        spec("b", max_concurrency=2),
        spec("c", max_concurrency=4),
        spec("d", max_concurrency=100),
    )
    for name, count in {"a": 5, "c": 1, "d": 10}.items():
        for _ in range(count):
            assert breakers.begin(name)
    # b 0/2, d 10/100, c 1/4, a 5/10: d has the most in flight but the most room.
    assert order(reg, policy="least_busy") == ["b", "d", "c", "a"]
    for _ in range(5):
        breakers.end("a")
    for _ in range(2):
        assert breakers.begin("b")
    assert order(reg, policy="least_busy") == ["a", "d", "c", "b"]


def test_round_robin_rotates_the_order_across_successive_calls():
    reg = registry(spec("a"), spec("b"), spec("c"))
    orders = [order(reg, policy="round_robin") for _ in range(4)]
    assert {o[0] for o in orders[:3]} == {"a", "b", "c"}  # each one leads once in three calls
    for names in orders:  # rotations of the default order, never shuffles
        start = names.index("a")
        assert names[start:] + names[:start] == ["a", "b", "c"]
    assert orders[3] == orders[0]


def test_round_robin_puts_a_stale_backend_last_whatever_its_turn():
    reg = registry(spec("a"), spec("b", health=Health.STALE), spec("c"))
    orders = [order(reg, policy="round_robin") for _ in range(3)]
    assert all(names[-1] == "b" for names in orders)
    assert {names[0] for names in orders} == {"a", "c"}


AFFINITY_BACKENDS = [spec(f"gpu-{i}") for i in range(5)]


def affinity_first(reg: BackendRegistry, *, tenant: str = "t1", prefix: str = "") -> str:
    return order(reg, policy="affinity", need=Need("chat", tenant=tenant, prefix=prefix))[0]


def test_affinity_sends_the_same_tenant_and_prefix_to_the_same_backend():
    reg = registry(*AFFINITY_BACKENDS)
    first = affinity_first(reg, prefix="You are a helpful assistant.")
    assert all(
        affinity_first(reg, prefix="You are a helpful assistant.") == first for _ in range(20)
    )
    # The registry listing its routes in another order changes nothing.
    reordered = registry(*reversed(AFFINITY_BACKENDS))
    assert affinity_first(reordered, prefix="You are a helpful assistant.") == first


def test_affinity_spreads_different_prefixes_and_tenants_over_the_backends():
    reg = registry(*AFFINITY_BACKENDS)
    by_prefix = [affinity_first(reg, prefix=f"system prompt #{i}") for i in range(50)]
    assert len(set(by_prefix)) >= 3
    assert max(by_prefix.count(name) for name in set(by_prefix)) <= 25
    by_tenant = {affinity_first(reg, tenant=f"tenant-{i}", prefix="same prompt") for i in range(50)}
    assert len(by_tenant) >= 3


def test_affinity_keeps_its_choices_when_another_backend_leaves():
    reg = registry(*AFFINITY_BACKENDS)
    prefixes = [f"p{i}" for i in range(40)]
    before = {p: affinity_first(reg, prefix=p) for p in prefixes}
    gone = "gpu-2"
    reg_without = registry(*[b for b in AFFINITY_BACKENDS if b.name != gone])
    after = {p: affinity_first(reg_without, prefix=p) for p in prefixes}
    moved = [p for p in prefixes if before[p] != after[p]]
    assert moved and all(before[p] == gone for p in moved)  # only gpu-2's prefixes moved


def test_affinity_goes_elsewhere_while_its_backend_is_at_max_concurrency():
    backends = [spec(f"gpu-{i}", max_concurrency=2) for i in range(5)]
    reg = registry(*backends)
    need = Need("chat", tenant="t1", prefix="long shared system prompt")
    usual = order(reg, policy="affinity", need=need)
    chosen = usual[0]
    assert breakers.begin(chosen)
    assert order(reg, policy="affinity", need=need)[0] == chosen  # 1 of 2: still room
    assert breakers.begin(chosen)
    busy = order(reg, policy="affinity", need=need)
    assert busy == usual[1:] + [chosen]  # the next choice, the full one tried last
    breakers.end(chosen)
    assert order(reg, policy="affinity", need=need) == usual


# -- health and circuit state ------------------------------------------------------------------


def test_stale_sorts_last_and_offline_is_excluded_whatever_the_policy():
    reg = registry(
        spec("a-stale", health=Health.STALE, energy_mj_per_token=1),
        spec("b-offline", health=Health.OFFLINE, energy_mj_per_token=1),
        spec("c-live", health=Health.LIVE, energy_mj_per_token=500),
        spec("d-live", health=Health.LIVE, energy_mj_per_token=100),
    )
    assert order(reg) == ["c-live", "d-live", "a-stale"]
    assert order(reg, policy="energy") == ["d-live", "c-live", "a-stale"]
    reg.agents[AGENT] = AgentPlan(chain=("b-offline", "a-stale", "c-live"))
    assert order(reg) == ["c-live", "a-stale"]


def test_a_never_probed_backend_ranks_after_live_ones():
    reg = registry(
        spec("a-new", health=Health.UNKNOWN),
        spec("b-live", health=Health.LIVE),
        spec("c-stale", health=Health.STALE),
    )
    assert order(reg) == ["b-live", "a-new", "c-stale"]


def test_an_open_breaker_excludes_its_backend_until_the_cooldown(settings):
    settings.FAIRLANE_BREAKER_FAILURES = 2
    settings.FAIRLANE_BREAKER_COOLDOWN_SECONDS = 30
    reg = registry(spec("a"), spec("b"))
    breakers.failure("a")
    assert order(reg) == ["a", "b"]  # one failure is not enough
    breakers.failure("a")
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=CHAT)
    assert [r.backend.name for r in plan.routes] == ["b"] and plan.blocked_for == 0

    settings.FAIRLANE_BREAKER_COOLDOWN_SECONDS = 0  # the cooldown is over: a half-open trial
    assert order(reg) == ["a", "b"]


def test_when_every_backend_is_open_or_cooling_the_plan_says_how_long_to_wait(settings):
    settings.FAIRLANE_BREAKER_FAILURES = 1
    settings.FAIRLANE_BREAKER_COOLDOWN_SECONDS = 30
    reg = registry(spec("a"), spec("b"))
    breakers.failure("a")
    breakers.failure("b")
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=CHAT)
    assert plan.routes == [] and not plan.unsupported
    assert 25 < plan.blocked_for <= 30

    breakers.reset()
    breakers.failure("a")
    breakers.cool("b", 5)  # 429 Retry-After: 5 -- the sooner of the two
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=CHAT)
    assert plan.routes == [] and 0 < plan.blocked_for <= 5


def test_an_offline_backend_is_no_reason_to_wait():
    reg = registry(spec("a", health=Health.OFFLINE))
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=CHAT)
    assert plan.routes == [] and plan.blocked_for == 0 and not plan.unsupported


# -- capabilities ------------------------------------------------------------------------------

SUPPORTS = [
    # Anthropic: one chat choice, no logprobs.
    ("anthropic", {}, Need("chat"), True),
    ("anthropic", {}, Need("chat", n=2), False),
    ("anthropic", {}, Need("completion"), False),
    ("anthropic", {}, Need("chat", logprobs=True), False),
    ("openai", {}, Need("chat", n=2), True),
    ("openai", {}, Need("chat", logprobs=True), True),
    ("openai", {}, Need("completion"), True),
    ("openai", {}, Need("completion", logprobs=True), False),
    # Embeddings need hidden states, from a kind that serves them.
    ("openai", {}, Need("embed"), False),
    ("openai", {"hidden_states": True}, Need("embed"), True),
    ("openai_compatible", {"hidden_states": True}, Need("embed"), True),
    ("fairlane", {"hidden_states": True}, Need("embed"), True),
    ("fairlane", {}, Need("embed"), False),
    ("openrouter", {"hidden_states": True}, Need("embed"), False),
    ("anthropic", {"hidden_states": True}, Need("embed"), False),
    # Token ids (prompts or logit_bias) mean our tokenizer: local or another Fairlane.
    ("local", {}, Need("completion", token_prompts=True), True),
    ("fairlane", {}, Need("completion", token_prompts=True), True),
    ("openai_compatible", {}, Need("completion", token_prompts=True), False),
    ("openai", {}, Need("completion", token_prompts=True), False),
    ("openrouter", {}, Need("completion", token_prompts=True), False),
    ("fairlane", {}, Need("chat", logit_bias=True), True),
    ("openai", {}, Need("chat", logit_bias=True), False),
    ("local", {}, Need("embed"), True),
]


@pytest.mark.parametrize(("kind", "fields", "need", "expected"), SUPPORTS)
def test_route_supports(kind, fields, need, expected):
    assert route_supports(route(spec("x", kind, **fields)), need) is expected


def test_a_backend_whose_context_is_too_small_for_the_need_is_excluded():
    reg = registry(
        spec("a-small", context_length=1000),
        spec("b-any", context_length=0),
        spec("c-large", context_length=100_000),
    )
    fits = Need("chat", prompt_tokens=400, max_tokens=500)
    assert order(reg, need=fits) == ["a-small", "b-any", "c-large"]
    assert order(reg, need=Need("chat", prompt_tokens=400, max_tokens=2000)) == ["b-any", "c-large"]
    # A prompt of 40 000 bytes is thousands of tokens whatever the tokenizer.
    assert order(reg, need=Need("chat", prompt_tokens=40_000, max_tokens=10)) == [
        "b-any",
        "c-large",
    ]
    assert route_supports(
        route(spec("local", "local", context_length=10)),
        Need("chat", prompt_tokens=40_000, max_tokens=10),
    )


def test_a_model_no_backend_can_serve_for_this_need_is_unsupported():
    reg = registry(spec("claude", "anthropic"), spec("gpt", "openai"))
    plan = route_plan(
        registry=reg, agent_id=AGENT, model="m", need=Need("completion", token_prompts=True)
    )
    assert plan.routes == [] and plan.unsupported and plan.blocked_for == 0
    plan = route_plan(registry=reg, agent_id=AGENT, model="m", need=Need("chat", n=3))
    assert [r.backend.name for r in plan.routes] == ["gpt"] and not plan.unsupported


# -- the snapshot from the database ------------------------------------------------------------


def remote(name: str, kind: str, model: str = "tiny", **fields) -> Backend:
    backend = backend_register(name=name, kind=kind, base_url=f"http://{name}.example", **fields)
    backend_model_set(
        backend=backend, model=model, upstream_name=f"{name}/{model}", price_input_per_mtok=7
    )
    return backend


def test_registry_load_reads_enabled_backends_and_local_models_in_kind_order(db):
    model_register(name="tiny", source="preset:tiny", price_input_per_mtok=3)
    for name, kind in [
        ("a-openai", "openai"),
        ("b-anthropic", "anthropic"),
        ("c-openrouter", "openrouter"),
        ("d-compat", "openai_compatible"),
        ("e-fairlane", "fairlane"),
    ]:
        remote(name, kind)
    remote("f-disabled", "fairlane", is_enabled=False)
    remote("f-disabled", "fairlane", model="only-there", is_enabled=False)

    reg = registry_load()
    assert "f-disabled" not in reg.backends and "only-there" not in reg.routes
    assert order(reg, model="tiny") == [
        "local",
        "e-fairlane",
        "d-compat",
        "c-openrouter",
        "b-anthropic",
        "a-openai",
    ]
    by_name = {r.backend.name: r for r in reg.routes["tiny"]}
    assert by_name["local"].upstream == "tiny" and by_name["local"].info.price_input_per_mtok == 3
    assert by_name["a-openai"].upstream == "a-openai/tiny"
    assert by_name["a-openai"].info.price_input_per_mtok == 7
    assert by_name["a-openai"].info.source == "backend:a-openai"

    Backend.objects.filter(name="f-disabled").update(is_enabled=True)
    reg = registry_load()
    assert [r.backend.name for r in reg.routes["only-there"]] == ["f-disabled"]
    Backend.objects.filter(name="a-openai").update(is_enabled=False)
    assert "a-openai" not in order(registry_load(), model="tiny")


def test_a_registered_local_backend_replaces_the_built_in_one_and_a_disabled_one_removes_it(db):
    model_register(name="tiny", source="preset:tiny")
    remote("remote", "openai")
    pool = backend_register(name="gpu-pool", kind="local", max_concurrency=8)
    backend_model_set(backend=pool, model="tiny")  # the pool serves the registered models
    backend_model_set(backend=pool, model="not-registered")
    reg = registry_load()
    assert "local" not in reg.backends and "not-registered" not in reg.routes
    assert order(reg, model="tiny") == ["gpu-pool", "remote"]
    assert reg.routes["tiny"][0].backend.max_concurrency == 8

    backend_register(name="gpu-pool", kind="local", is_enabled=False)
    reg = registry_load()
    assert order(reg, model="tiny") == ["remote"] and "local" not in reg.backends
    pool.delete()
    assert order(registry_load(), model="tiny") == ["local", "remote"]


def test_registry_get_reuses_the_snapshot_until_a_registry_write(db):
    remote("a", "openai")
    first = registry_get()
    assert registry_get() is first
    remote("b", "openai")  # post_save drops the snapshot at once
    second = registry_get()
    assert second is not first and order(second, model="tiny") == ["a", "b"]
