"""Our engine on a workload: everything submitted at t=0, stepped until done."""

from __future__ import annotations

import time
from pathlib import Path

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.bench.results import RunResult, tpots
from workers.engine.bench.workload import Request


def engine_run(
    model_dir: Path, requests: list[Request], *, name: str = "ours", **config
) -> RunResult:
    engine = LLMEngine(EngineConfig(model=str(model_dir), **config))
    _warm_up(engine)
    start, cpu_start = time.perf_counter(), time.process_time()
    ids = [
        engine.add_request(
            r.prompt,
            SamplingParams(max_tokens=r.num_output_tokens, temperature=0.0, ignore_eos=True),
            arrival_time=start,
        )
        for r in requests
    ]
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    num_tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - start
            if out.finished:
                done[out.request_id] = time.perf_counter() - start
            num_tokens += len(out.new_token_ids)
    makespan = time.perf_counter() - start
    stats = engine.stats()
    assert num_tokens == sum(r.num_output_tokens for r in requests)
    extra = {
        "kv_waste": round(stats["kv_waste"], 4),
        "prefix_hit_rate": round(stats["prefix_hit_rate"], 4),
        "num_preemptions": stats["num_preemptions"],
        "batch_seqs_mean": round(stats["batch_seqs_mean"], 2),
        "num_steps": stats["num_steps"],
    }
    ttft = [first[i] for i in ids]
    return RunResult(
        name,
        makespan,
        num_tokens,
        ttft,
        time.process_time() - cpu_start,
        extra,
        tpot_s=tpots(requests, ttft, [done[i] for i in ids]),
    )


def _warm_up(engine: LLMEngine) -> None:
    """One short request, so one-time costs (allocator, kernels) are not in the timing."""
    engine.generate([[5] * 40], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
