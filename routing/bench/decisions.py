"""`python manage.py bench routing`: how long one routing decision takes with 100 registered
backends, for every policy.

A decision is what the request path does before dispatch: take the registry snapshot, filter
the model's backends by capability, health and circuit state, and order them by the policy.
The baseline is the same decision reading the registry from the database each time (what a
router without the in-process snapshot pays); both run in this one process, on the same rows.
Prints decisions per second and p50/p99 per decision for each policy, the ratio to the
baseline, and (last line) one JSON object. Goal: p99 under 1 ms.

Then the gateway as a whole (skip with --no-proxy): the same streamed chat requests sent
straight to a fake OpenAI-format provider (a real HTTP server on 127.0.0.1, answering at
once, so only overheads are measured) and through uvicorn -> Django -> admission, budget
hold, routing -> httpx -> the provider -> SSE re-encoded; one at a time (added latency to
the first token and to the end, p50/p99), then many at once (requests per second, ratio).
Both run on this machine's cores alongside the provider, which is the same for both.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from django.db import transaction

from routing.breaker import breakers
from routing.models import Backend, BackendKind, BackendModel, Policy
from routing.router import (
    AgentPlan,
    Need,
    registry_get,
    registry_invalidate,
    registry_load,
    route_plan,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench-routing-model"
PREFIX = "bench-routing-"  # the rows this bench makes, and removes
KINDS = [
    BackendKind.FAIRLANE,
    BackendKind.OPENAI_COMPATIBLE,
    BackendKind.OPENROUTER,
    BackendKind.OPENAI,
    BackendKind.ANTHROPIC,
]


def parse(argv):
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="fewer decisions, a few seconds")
    p.add_argument("--backends", type=int, default=100)
    p.add_argument(
        "--decisions", type=int, default=None, help="decisions per policy (20000; quick 2000)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-proxy", action="store_true", help="skip the end-to-end phase")
    p.add_argument(
        "--proxy-requests",
        type=int,
        default=None,
        help="sequential requests in the end-to-end phase (200; quick 40)",
    )
    p.add_argument("--proxy-concurrency", type=int, default=64)
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "routing.json")
    return p.parse_args(argv)


def _register(count: int, rng: random.Random) -> list[str]:
    names = []
    with transaction.atomic():
        for i in range(count):
            backend = Backend.objects.create(
                name=f"{PREFIX}{i:03d}",
                kind=KINDS[i % len(KINDS)],
                base_url=f"http://127.0.0.1:{20000 + i}",
                context_length=rng.choice([0, 8192, 32768]),
                max_concurrency=rng.randint(1, 64),
                zone=f"zone-{i % 7}",
                energy_mj_per_token=rng.randint(0, 500),
                carbon_g_per_kwh=rng.randint(20, 700),
                probe_p95_ms=rng.uniform(20, 900),
                health=rng.choice(["live"] * 8 + ["stale", "unknown"]),
            )
            BackendModel.objects.create(
                backend=backend,
                model=MODEL,
                upstream_name=f"upstream-{i}",
                price_input_per_mtok=rng.randint(0, 500) * 100_000,
                price_output_per_mtok=rng.randint(0, 1500) * 100_000,
            )
            names.append(backend.name)
    return names


def _state(names: list[str], rng: random.Random) -> None:
    """Some history, as a running process has: latencies, requests in flight, one breaker
    open."""
    for name in names:
        for _ in range(20):
            breakers.success(name, rng.uniform(30, 1200))
        for _ in range(rng.randint(0, 8)):
            breakers.begin(name)
    for _ in range(10):
        breakers.failure(names[0])


def _needs(rng: random.Random, count: int) -> list[Need]:
    return [
        Need(
            endpoint="chat",
            prompt_tokens=rng.randint(10, 4000),
            max_tokens=rng.randint(16, 1024),
            tenant=str(rng.randint(1, 50)),
            prefix=f"system prompt {rng.randint(1, 200)}",
        )
        for _ in range(count)
    ]


def _measure(decide, needs: list[Need]) -> list[float]:
    times = []
    for need in needs:
        started = time.perf_counter_ns()
        decide(need)
        times.append((time.perf_counter_ns() - started) / 1000)  # microseconds
    return times


def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {
        "decisions": len(times),
        "per_second": round(len(times) / (sum(times) / 1e6), 1),
        "p50_us": round(statistics.median(ordered), 1),
        "p99_us": round(ordered[min(int(len(ordered) * 0.99), len(ordered) - 1)], 1),
    }


def run(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    rng = random.Random(args.seed)
    decisions = args.decisions or (2000 if args.quick else 20000)
    Backend.objects.filter(name__startswith=PREFIX).delete()
    names = _register(args.backends, rng)
    breakers.reset()
    _state(names, rng)
    needs = _needs(rng, decisions)
    results: dict = {"backends": args.backends, "policies": {}}
    try:
        registry_invalidate()
        registry = registry_get()
        chain = AgentPlan(chain=tuple(reversed(names)))
        registry.agents["bench-chain-agent"] = chain

        def ours(policy):
            agent = "bench-chain-agent" if policy == Policy.CHAIN else "bench-agent"

            def decide(need):
                plan = route_plan(
                    registry=registry_get(), agent_id=agent, model=MODEL, need=need, policy=policy
                )
                assert plan.routes, "no route"

            return decide

        def baseline(need):  # the registry read from the database for every decision
            fresh = registry_load()
            fresh.agents["bench-chain-agent"] = chain
            route_plan(
                registry=fresh, agent_id="bench-agent", model=MODEL, need=need, policy=Policy.CHAIN
            )

        base_count = max(decisions // 20, 50)
        base = _summary(_measure(baseline, needs[:base_count]))
        results["baseline_db_each_decision"] = base
        print(f"{args.backends} backends, {decisions} decisions per policy")
        print(
            f"baseline (registry from the database each time): p50 {base['p50_us']} us, "
            f"p99 {base['p99_us']} us, {base['per_second']}/s"
        )
        print(
            f"{'policy':<12} {'per second':>12} {'p50 us':>9} {'p99 us':>9} {'vs baseline p50':>16}"
        )
        for policy in Policy.values:
            _measure(ours(policy), needs[:200])  # warm-up
            figures = _summary(_measure(ours(policy), needs))
            figures["speedup_p50_vs_baseline"] = round(base["p50_us"] / figures["p50_us"], 1)
            figures["p99_under_1ms"] = figures["p99_us"] < 1000
            results["policies"][policy] = figures
            print(
                f"{policy:<12} {figures['per_second']:>12,.0f} {figures['p50_us']:>9} "
                f"{figures['p99_us']:>9} {figures['speedup_p50_vs_baseline']:>15}x"
            )
        results["all_p99_under_1ms"] = all(p["p99_under_1ms"] for p in results["policies"].values())
        print(f"p99 under 1 ms for every policy: {results['all_p99_under_1ms']}")
    finally:
        Backend.objects.filter(name__startswith=PREFIX).delete()
        registry_invalidate()
        breakers.reset()
    if not args.no_proxy:
        results["proxy"] = proxy_measure(args)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results))
    return results


async def _stream(client, url: str, headers: dict, model: str) -> tuple[float, float]:
    body = {
        "model": model,
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "benchmark the gateway"}],
    }
    start, first = time.perf_counter(), None
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and '"content":"t' in line.replace(" ", ""):
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


def proxy_measure(args) -> dict:
    import asyncio

    import httpx

    from routing.backend_store import backend_model_set, backend_register
    from routing.bench.fakes import FakeProvider
    from routing.bench.serving import embedded_server
    from tenants.models import Agent, Scope, Tenant
    from tenants.services.keys import api_key_create, api_key_revoke
    from tenants.services.tenancy import agent_create, tenant_create

    sequential = args.proxy_requests or (40 if args.quick else 200)
    concurrency = args.proxy_concurrency
    fake = FakeProvider("openai", reply_tokens=16).start()
    tenant = Tenant.objects.filter(slug="bench").first() or tenant_create(
        name="Benchmarks", slug="bench", owner=None
    )
    agent = Agent.objects.filter(tenant=tenant, name="bench").first() or agent_create(
        tenant=tenant, name="bench"
    )
    key, plain = api_key_create(
        tenant=tenant, agent=agent, name="bench routing", scopes=[Scope.INFERENCE]
    )
    backend = backend_register(
        name=PREFIX + "proxy", kind="openai", base_url=fake.url, credential=fake.api_key
    )
    backend_model_set(backend=backend, model=PREFIX + "model", upstream_name="fake-model")
    server = embedded_server(threads=1)

    async def measure():
        limits = httpx.Limits(max_connections=concurrency * 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            direct = (fake.url, {"Authorization": f"Bearer {fake.api_key}"}, "fake-model")
            gateway = (server.url, {"Authorization": f"Bearer {plain}"}, PREFIX + "model")
            for target in (direct, gateway):  # warm both paths
                await _stream(client, *target)
            d, g = [], []
            for _ in range(sequential):
                d.append(await _stream(client, *direct))
                g.append(await _stream(client, *gateway))

            async def burst(target):
                gate = asyncio.Semaphore(concurrency)

                async def one():
                    async with gate:
                        await _stream(client, *target)

                started = time.perf_counter()
                await asyncio.gather(*(one() for _ in range(concurrency * 4)))
                return concurrency * 4 / (time.perf_counter() - started)

            return d, g, await burst(direct), await burst(gateway)

    try:
        d, g, direct_rps, gateway_rps = asyncio.run(measure())
    finally:
        server.stop()
        fake.stop()
        api_key_revoke(key=key)
        Backend.objects.filter(name__startswith=PREFIX).delete()

    def pct(values, q):
        ordered = sorted(values)
        return round(ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000, 2)

    ttft_added = [gt - dt for (dt, _), (gt, _) in zip(d, g, strict=False)]
    total_added = [gtot - dtot for (_, dtot), (_, gtot) in zip(d, g, strict=False)]
    figures = {
        "sequential": sequential,
        "concurrency": concurrency,
        "direct_total_ms_p50": pct([t for _, t in d], 0.5),
        "gateway_total_ms_p50": pct([t for _, t in g], 0.5),
        "added_ttft_ms_p50": pct(ttft_added, 0.5),
        "added_ttft_ms_p99": pct(ttft_added, 0.99),
        "added_total_ms_p50": pct(total_added, 0.5),
        "added_total_ms_p99": pct(total_added, 0.99),
        "direct_rps": round(direct_rps, 1),
        "gateway_rps": round(gateway_rps, 1),
        "rps_ratio_gateway_over_direct": round(gateway_rps / direct_rps, 3),
    }
    print(
        f"end to end, {sequential} streamed chats one at a time: direct p50 "
        f"{figures['direct_total_ms_p50']} ms, through the gateway p50 "
        f"{figures['gateway_total_ms_p50']} ms; added to first token p50 "
        f"{figures['added_ttft_ms_p50']} ms, p99 {figures['added_ttft_ms_p99']} ms; added to "
        f"the end p50 {figures['added_total_ms_p50']} ms, p99 {figures['added_total_ms_p99']} ms"
    )
    print(
        f"{concurrency} at once: direct {figures['direct_rps']} req/s, gateway "
        f"{figures['gateway_rps']} req/s, ratio {figures['rps_ratio_gateway_over_direct']}"
    )
    return figures
