"""Scheduling: budgets and limits hold, the ordering hook decides who goes first."""

from __future__ import annotations

from workers.engine import FairSharePolicy, KeyPolicy, SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LANES = ("realtime", "standard", "bulk")  # the caller's lanes, first to last


def _first_tokens_order(engine) -> list[str]:
    order: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids and out.request_id not in order:
                order.append(out.request_id)
    return order


def test_token_budget_and_max_seqs_hold_every_step(make_engine, prompts):
    engine = make_engine(max_num_batched_tokens=40, max_num_seqs=5)
    for p in prompts:
        engine.add_request(p, PARAMS)
    while engine.has_unfinished_requests():
        batch = engine.scheduler.schedule()
        assert batch.num_tokens <= 40 and len(engine.scheduler.running) <= 5
        # put the batch back through the normal path
        result = engine.runner.execute(batch)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=False):
            seq.num_computed_tokens += n
            engine.block_manager.commit(seq)
        engine._append_tokens(result)
    assert engine.stats()["num_finished"] == {"length": len(prompts)}


def test_realtime_lane_goes_before_bulk(make_engine):
    engine = make_engine(max_num_seqs=1, policy=FairSharePolicy(lanes=LANES))
    engine.add_request([5] * 8, PARAMS, request_id="bulk", lane="bulk")
    engine.add_request([6] * 8, PARAMS, request_id="standard", lane="standard")
    engine.add_request([7] * 8, PARAMS, request_id="realtime", lane="realtime")
    assert _first_tokens_order(engine) == ["realtime", "standard", "bulk"]


def test_lowest_virtual_token_counter_goes_first(make_engine):
    """A tenant that flooded the queue does not starve one that sent a single request."""
    engine = make_engine(max_num_seqs=1)
    for i in range(4):
        engine.add_request([5 + i] * 8, PARAMS, request_id=f"flood-{i}", tenant="flood")
    engine.add_request([9] * 8, PARAMS, request_id="quiet-0", tenant="quiet")
    order = _first_tokens_order(engine)
    assert order.index("quiet-0") <= 1


def test_tenant_weights_scale_the_counter():
    policy = FairSharePolicy(tenant_weights={"gold": 4.0})
    from workers.engine.sequence import Sequence

    gold = Sequence("g", [1], PARAMS, tenant="gold", lane="standard", salt="gold", arrival_time=0.0)
    plain = Sequence(
        "p", [1], PARAMS, tenant="plain", lane="standard", salt="plain", arrival_time=0.0
    )
    policy.on_scheduled(gold, 100)
    policy.on_scheduled(plain, 100)
    assert policy.virtual_tokens == {"gold": 25.0, "plain": 100.0}
    assert policy.key(gold) < policy.key(plain)


def test_custom_key_callable_orders_the_queue(make_engine, tiny_dir):
    from workers.engine import EngineConfig, LLMEngine

    engine = LLMEngine(
        EngineConfig(model=str(tiny_dir), num_kv_blocks=64, max_num_seqs=1),
        policy=KeyPolicy(lambda s: -s.num_prompt_tokens),
    )
    for n in (3, 9, 6):
        engine.add_request([5] * n, PARAMS, request_id=f"len-{n}")
    assert _first_tokens_order(engine) == ["len-9", "len-6", "len-3"]


def test_preemption_picks_the_lowest_priority_sequence(make_engine):
    engine = make_engine(
        num_kv_blocks=6, max_num_batched_tokens=256, policy=FairSharePolicy(lanes=LANES)
    )
    long = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engine.add_request([5] * 30, long, request_id="realtime", lane="realtime")
    engine.add_request([6] * 30, long, request_id="bulk", lane="bulk")
    realtime, bulk = engine.requests["realtime"], engine.requests["bulk"]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["num_finished"] == {"length": 2}
    assert realtime.num_preemptions == 0 and bulk.num_preemptions > 0


def test_a_request_as_large_as_the_pool_still_runs(make_engine):
    """The watermark is waived when nothing runs, and chunks shrink to the blocks there are."""
    engine = make_engine(num_kv_blocks=8, watermark=0.2, max_num_batched_tokens=1024)
    assert engine.max_model_len == 128
    out = engine.generate(
        [[5] * 120], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 8
    engine = make_engine(num_kv_blocks=8, watermark=0.2, is_chunked_prefill_enabled=False)
    assert (
        len(engine.generate([[5] * 120], SamplingParams(max_tokens=8, temperature=0))[0].token_ids)
        == 8
    )


def test_long_prompt_next_to_running_ones_is_chunked_to_free_blocks(
    make_engine, prompts, hf_greedy, greedy
):
    engine = make_engine(num_kv_blocks=30, max_num_batched_tokens=1024)
    outs = engine.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == hf_greedy
