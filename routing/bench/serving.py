"""`python manage.py bench serving`: what the full HTTP stack costs on top of the engine.

The same streaming workload (seeded token-id prompts, fixed output lengths, greedy) runs
straight into an in-process engine and through uvicorn -> Django -> admission and budgets ->
the embedded engine -> SSE, in one run on one machine:
  1. one request at a time, each path in turn: per-request overhead (HTTP minus direct) of the
     total latency and of the time to first token, p50 and p99;
  2. `--concurrency` clients at once: output tokens per second of each path and their ratio.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import time
from pathlib import Path

import httpx
import torch
from django.conf import settings

from routing.bench.processes import AsgiServer
from tenants.models import Agent, Scope, Tenant
from tenants.services.keys import api_key_create, api_key_revoke
from tenants.services.tenancy import agent_create, tenant_create
from workers.engine import AsyncEngine, EngineConfig, SamplingParams
from workers.models import ServedModel
from workers.serving.catalog import model_dir
from workers.serving.registration import model_register

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a small workload, under a minute")
    p.add_argument("--requests", type=int, default=None, help="requests per phase (48; quick 12)")
    p.add_argument("--concurrency", type=int, default=16, help="clients at once in phase 2")
    p.add_argument("--preset", "--model", default="small", help="model preset (default small)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "serving.json")
    return p.parse_args(argv)


def workload(*, seed: int, num: int, vocab: int, quick: bool) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    prompt_range, output_range = ((16, 128), (16, 48)) if quick else ((16, 256), (32, 128))
    return [
        (
            [rng.randrange(5, vocab) for _ in range(rng.randint(*prompt_range))],
            rng.randint(*output_range),
        )
        for _ in range(num)
    ]


def _setup(preset: str) -> tuple[str, str, object]:
    """A bench tenant, agent and key (revoked afterwards), and the model, free of charge."""
    tenant = Tenant.objects.filter(slug="bench").first() or tenant_create(
        name="Benchmarks", slug="bench", owner=None
    )
    agent = Agent.objects.filter(tenant=tenant, name="bench").first() or agent_create(
        tenant=tenant, name="bench"
    )
    model = f"bench-{preset}"
    model_register(name=model, source=f"preset:{preset}", description="bench serving")
    ServedModel.objects.filter(name=model).update(is_enabled=True)
    key, plain = api_key_create(
        tenant=tenant, agent=agent, name="bench serving", scopes=[Scope.INFERENCE]
    )
    return model, plain, key


def embedded_server(threads: int) -> AsgiServer:
    """uvicorn serving this checkout in the embedded mode, on a free port."""
    return AsgiServer(
        {
            **os.environ,
            "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
            "DJANGO_SETTINGS_MODULE": "settings",
            "FAIRLANE_ENGINE_MODE": "embedded",
            "FAIRLANE_ENGINE_THREADS": str(threads),
            "LOG_LEVEL": "WARNING",
        }
    )


async def _direct(
    engine: AsyncEngine, prompt: list[int], max_tokens: int
) -> tuple[float, float, int]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start, first, tokens = time.perf_counter(), None, 0
    async for out in engine.generate(prompt, params):
        # First visible text, as a client sees it (tokens ending mid-character show nothing).
        if out.new_text and first is None:
            first = time.perf_counter()
        tokens += len(out.new_token_ids)
    end = time.perf_counter()
    return (first or end) - start, end - start, tokens


async def _http(
    client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
) -> tuple[float, float, int]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return (first or end) - start, end - start, tokens


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _concurrent(fn, jobs, concurrency: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(concurrency)

    async def one(job):
        async with gate:
            return await fn(*job)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(job) for job in jobs))
    return time.perf_counter() - start, sum(r[2] for r in results)


async def _measure(args, model: str, key: str, engine: AsyncEngine, jobs) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    server = embedded_server(args.threads)
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=600) as client:
            await _http(client, model, jobs[0][0], 4)  # load the model in the server
            await _direct(engine, jobs[0][0], 4)
            overhead, ttft_overhead = [], []
            for prompt, max_tokens in jobs:
                d_ttft, d_total, d_tokens = await _direct(engine, prompt, max_tokens)
                h_ttft, h_total, h_tokens = await _http(client, model, prompt, max_tokens)
                assert d_tokens == h_tokens == max_tokens, (d_tokens, h_tokens, max_tokens)
                overhead.append((h_total - d_total) * 1000)
                ttft_overhead.append((h_ttft - d_ttft) * 1000)
            direct_span, direct_tokens = await _concurrent(
                lambda p, m: _direct(engine, p, m), jobs, args.concurrency
            )
            http_span, http_tokens = await _concurrent(
                lambda p, m: _http(client, model, p, m), jobs, args.concurrency
            )
    finally:
        server.stop()
    return {
        "overhead_ms_p50": _pct(overhead, 0.5),
        "overhead_ms_p99": _pct(overhead, 0.99),
        "overhead_ms_mean": statistics.fmean(overhead),
        "ttft_overhead_ms_p50": _pct(ttft_overhead, 0.5),
        "ttft_overhead_ms_p99": _pct(ttft_overhead, 0.99),
        "direct_tok_s": direct_tokens / direct_span,
        "http_tok_s": http_tokens / http_span,
        "direct_makespan_s": direct_span,
        "http_makespan_s": http_span,
        "tok_s_ratio_http_over_direct": (http_tokens / http_span) / (direct_tokens / direct_span),
    }


def run(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    num = args.requests or (12 if args.quick else 48)
    model, plain, key = _setup(args.preset)
    path = model_dir(f"preset:{args.preset}")
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    jobs = workload(seed=args.seed, num=num, vocab=vocab, quick=args.quick)
    engine = AsyncEngine.from_config(
        EngineConfig(
            model=str(path),
            num_threads=args.threads,
            max_num_seqs=settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
            kv_cache_memory_bytes=settings.FAIRLANE_ENGINE_KV_CACHE_MB << 20,
        )
    ).start()
    try:
        figures = asyncio.run(_measure(args, model, plain, engine, jobs))
    finally:
        engine.shutdown()
        api_key_revoke(key=key)
        ServedModel.objects.filter(name=model).update(is_enabled=False)  # out of /v1/models
    result = {
        "bench": "serving",
        "preset": args.preset,
        "requests": num,
        "concurrency": args.concurrency,
        "threads": args.threads,
        "output_tokens": sum(m for _, m in jobs),
        **{k: round(v, 3) for k, v in figures.items()},
    }
    print(f"serving bench: {num} requests, preset {args.preset}, {args.threads} threads")
    print(
        f"  per-request overhead (HTTP - direct): p50 {result['overhead_ms_p50']:.1f} ms, "
        f"p99 {result['overhead_ms_p99']:.1f} ms; TTFT overhead p50 "
        f"{result['ttft_overhead_ms_p50']:.1f} ms, p99 {result['ttft_overhead_ms_p99']:.1f} ms"
    )
    print(
        f"  {args.concurrency} concurrent: direct {result['direct_tok_s']:.1f} tok/s, HTTP "
        f"{result['http_tok_s']:.1f} tok/s, ratio {result['tok_s_ratio_http_over_direct']:.3f}"
    )
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
