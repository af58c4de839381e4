"""Prefix caching through the engine: hits within a tenant, never across tenants."""

from __future__ import annotations

from workers.engine import SamplingParams

SYSTEM = list(range(10, 10 + 64))  # four full blocks


def _cached(engine, prompt, **kwargs) -> int:
    return engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0), **kwargs)[
        0
    ].num_cached_tokens


def test_same_tenant_reuses_a_shared_system_prompt(make_engine):
    engine = make_engine()
    assert _cached(engine, SYSTEM + [1, 2, 3], tenant="acme") == 0
    assert _cached(engine, SYSTEM + [7, 8], tenant="acme") == 64
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] == 64 and 0 < stats["prefix_hit_rate"] < 1


def test_tenants_never_share_cached_blocks(make_engine):
    engine = make_engine()
    _cached(engine, SYSTEM + [1], tenant="acme")
    assert _cached(engine, SYSTEM + [1], tenant="globex") == 0
    assert (
        _cached(engine, SYSTEM + [1], tenant="acme", salt="globex") == 64
    )  # explicit salt decides
    assert engine.block_manager.num_prefix_hit_tokens == 64


def test_prefix_caching_off_never_hits(make_engine):
    engine = make_engine(is_prefix_caching_enabled=False)
    _cached(engine, SYSTEM + [1])
    assert _cached(engine, SYSTEM + [1]) == 0


def test_cache_survives_until_evicted(make_engine):
    engine = make_engine(num_kv_blocks=12)
    _cached(engine, SYSTEM + [1])
    assert _cached(engine, SYSTEM + [2]) == 64
    _cached(engine, list(range(100, 100 + 150)))  # needs 10 blocks: evicts the system prompt
    assert _cached(engine, SYSTEM + [3]) < 64


def test_simultaneous_arrivals_wait_for_the_prefix_being_computed(make_engine):
    """Agents of one tenant sending the same system prompt at once compute it once."""
    engine = make_engine()
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    outs = engine.generate(
        [SYSTEM + [1, 2], SYSTEM + [3], SYSTEM + [4, 5, 6]], params, tenant="acme"
    )
    assert [o.num_cached_tokens for o in outs] == [0, 64, 64]
    alone = [
        make_engine().generate([p], params)[0].token_ids for p in (SYSTEM + [3], SYSTEM + [4, 5, 6])
    ]
    assert [o.token_ids for o in outs[1:]] == alone
