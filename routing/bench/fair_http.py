"""`python manage.py bench fairness --http`: fairness inside the batch, over HTTP.

The distributed mode as deployed (uvicorn -> admission -> the Redis fair queue -> one Celery
GPU worker of `--slots` slots -> the stream back), with two tenants: a quiet one with
`--quiet-clients` closed-loop clients and a flooding one with `--flood-clients`, every
request a streamed completion of a seeded token-id prompt. Three phases of `--seconds` each
(each flood configuration on a worker process of its own, alone on the first of them; one API
process serves all):

  alone      the quiet tenant by itself;
  flood/off  both tenants, FAIRLANE_FAIR_EXTRA_SLOTS=0 (a flood holds every slot: the quiet
             tenant's request waits for a flood request to finish);
  flood/on   both tenants, FAIRLANE_FAIR_EXTRA_SLOTS=`--extra` (the worker takes the quiet
             tenant's request beyond its slots and its engine preempts a flood sequence), and
             the step share as `--step-share` / `--no-step-share` say (default: the setting's
             default, on on the CPU).

Printed: the quiet tenant's latency p50/p95 (and TTFT) per phase with its ratio to alone
(goal with fairness on: p50 within 1.8x of alone), and the throughput under the flood with
fairness on against off (goal: within 5 %) as tokens processed (prompt + output), output
tokens and requests per second. The last line is one JSON object.

`--rounds N` repeats the phases N times, a fresh worker for each configuration in each round
and the configurations' order rotated from round to round, so that a machine's drift falls
on all of them alike. Each phase's figures are then the median over the rounds, and each
ratio is the median of the rounds' own ratios (alone and the flood phases of one round ran
minutes apart, not hours), printed with its range. `--with-step-share` measures fairness on
both without the step share (flood/on) and with it (flood/on+step, a third configuration) in
the same rounds: the comparison that decided that the step share is on by default on the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

import httpx
from django.conf import settings

from routing.bench.processes import AsgiServer, CeleryWorker

ROOT = Path(__file__).resolve().parents[2]


def _setup(preset: str) -> tuple[str, str, str]:
    """Two bench tenants (quiet and flood), each with an agent, a key and budgets that never
    run out; the model registered and enabled."""
    from tenants.models import Agent, Budget, Scope, Tenant
    from tenants.services.budgets import budget_create
    from tenants.services.keys import api_key_create
    from tenants.services.tenancy import agent_create, tenant_create
    from workers.models import ServedModel
    from workers.serving.registration import model_register

    keys = []
    for slug in ("bench-quiet", "bench-flood"):
        tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(
            name=slug, slug=slug, owner=None
        )
        agent = Agent.objects.filter(tenant=tenant, name="bench").first() or agent_create(
            tenant=tenant, name="bench"
        )
        for owner in (None, agent):
            if not Budget.objects.filter(tenant=tenant, agent=owner).exists():
                budget_create(tenant=tenant, agent=owner, limit_microcents=10**15)
        keys.append(
            api_key_create(
                tenant=tenant, agent=agent, name="bench fairness", scopes=[Scope.INFERENCE]
            )[1]
        )
    model = f"bench-{preset}"
    model_register(name=model, source=f"preset:{preset}", description="bench fairness")
    ServedModel.objects.filter(name=model).update(is_enabled=True)
    return model, keys[0], keys[1]


def _env(args, extra: int, namespace: str, step_share: bool | None = None) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
        "FAIRLANE_ENGINE_MODE": "distributed",
        "FAIRLANE_ENGINE_MAX_NUM_SEQS": str(args.slots),
        "FAIRLANE_WORKER_CONCURRENCY": str(args.slots),
        "FAIRLANE_REALTIME_RESERVED_SLOTS": "0",
        "FAIRLANE_FAIR_EXTRA_SLOTS": str(extra),
        "FAIRLANE_ENGINE_FAIR_STEP_SHARE": "1"
        if (args.step_share if step_share is None else step_share)
        else "0",
        "FAIRLANE_ENGINE_THREADS": str(args.threads),
        "FAIRLANE_HEARTBEAT_SECONDS": "1",
        # A queue of its own, so nothing a test or an earlier run left queued reaches it.
        "FAIRLANE_QUEUE_NAMESPACE": namespace,
        "SECRET_KEY": settings.SECRET_KEY,
        "LOG_LEVEL": "WARNING",
    }


class Client:
    """Closed-loop streaming clients of one tenant: each sends its next request as soon as
    the last one ended, until the phase's end; every request's (ttft, latency, tokens)."""

    def __init__(self, http: httpx.AsyncClient, model: str, key: str, args, seed: int) -> None:
        self.http, self.model, self.key, self.args = http, model, key, args
        self.rng = random.Random(seed)
        self.results: list[tuple[float, float, int]] = []

    async def one(self, max_tokens: int) -> tuple[float, float, int]:
        prompt = [self.rng.randrange(5, 250) for _ in range(self.args.prompt_tokens)]
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start, first, tokens = time.perf_counter(), None, 0
        async with self.http.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {self.key}"}
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                    first = time.perf_counter()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        end = time.perf_counter()
        return (first or end) - start, end - start, tokens

    async def loop(self, until: float, max_tokens: int, measure_from: float) -> None:
        while time.perf_counter() < until:
            sent = time.perf_counter()
            result = await self.one(max_tokens)
            if sent >= measure_from:
                self.results.append(result)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _phase(url: str, model: str, quiet_key: str, flood_key: str | None, args) -> dict:
    """One phase: warm the model, then run the clients for --seconds (the first second not
    measured); the quiet tenant's latencies and every client's output tokens/s."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await Client(http, model, quiet_key, args, seed=-1).one(4)  # loads the model
        start = time.perf_counter()
        measure_from, until = start + 1.0, start + 1.0 + args.seconds
        quiet = [Client(http, model, quiet_key, args, seed=i) for i in range(args.quiet_clients)]
        flood = (
            [Client(http, model, flood_key, args, seed=1000 + i) for i in range(args.flood_clients)]
            if flood_key
            else []
        )
        await asyncio.gather(
            *(c.loop(until, args.quiet_tokens, measure_from) for c in quiet),
            *(c.loop(until, args.flood_tokens, measure_from) for c in flood),
        )
        elapsed = time.perf_counter() - measure_from
    latencies = [r[1] * 1000 for c in quiet for r in c.results]
    ttfts = [r[0] * 1000 for c in quiet for r in c.results]
    tokens = sum(r[2] for c in (*quiet, *flood) for r in c.results)
    requests = sum(len(c.results) for c in (*quiet, *flood))
    return {
        "quiet_requests": len(latencies),
        "quiet_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "quiet_p95_ms": round(_pct(latencies, 0.95), 1) if latencies else None,
        "quiet_ttft_p50_ms": round(statistics.median(ttfts), 1) if ttfts else None,
        "flood_requests": sum(len(c.results) for c in flood),
        "output_tokens_per_s": round(tokens / elapsed, 1),
        # The engine's work: every prompt token prefilled and every token generated. Fairness
        # changes the mix (more of the quiet tenant's short requests), so output tokens alone
        # would count its prompts as lost throughput.
        "processed_tokens_per_s": round((tokens + requests * args.prompt_tokens) / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 2),
        "seconds": round(elapsed, 1),
    }


def _engine_stats(model: str, worker: CeleryWorker) -> dict:
    """The worker's engine counters, from its heartbeat (one a second: wait for one sent after
    the phase)."""
    import redis

    from workers.pools import workers_live

    client = redis.Redis.from_url(settings.REDIS_URL)
    time.sleep(1.5)
    stats = [
        b["stats"][model]
        for b in workers_live(client, namespace="*")  # its worker runs under a namespace
        if b["id"].endswith(f":{worker.proc.pid}") and model in b.get("stats", {})
    ]
    return {
        "fair_preemptions": sum(s.get("num_fair_preemptions", 0) for s in stats),
        "preemptions": sum(s.get("num_preemptions", 0) for s in stats),
    }


# The figures of a phase that are medians over rounds and that ratios are taken of.
FIGURES = ("output_tokens_per_s", "processed_tokens_per_s", "requests_per_s")


def _configs(args) -> list[tuple[str, int, bool]]:
    """The flood configurations: (phase, FAIRLANE_FAIR_EXTRA_SLOTS, step share)."""
    if args.with_step_share:
        return [
            ("flood/off", 0, False),
            ("flood/on", args.extra, False),
            ("flood/on+step", args.extra, True),
        ]
    return [("flood/off", 0, False), ("flood/on", args.extra, args.step_share)]


def _round(args, server, model, quiet_key, flood_key, namespace, index) -> dict[str, dict]:
    """One round: each configuration on a fresh worker (its counters start at zero), in an
    order rotated by the round's index; the quiet tenant alone on the first one."""
    configs = _configs(args)
    shift = index % len(configs)
    phases: dict[str, dict] = {}
    for position, (name, extra, step_share) in enumerate(configs[shift:] + configs[:shift]):
        env = _env(args, extra, namespace, step_share)
        worker = CeleryWorker(env, concurrency=args.slots + max(extra, 0) + 4, name="fairness")
        try:
            before = {"fair_preemptions": 0, "preemptions": 0}
            for phase in ("alone", name) if position == 0 else (name,):
                flood = flood_key if phase != "alone" else None
                phases[phase] = asyncio.run(_phase(server.url, model, quiet_key, flood, args))
                after = _engine_stats(model, worker)
                phases[phase].update({k: after[k] - before[k] for k in after})
                before = after
                print(f"  round {index + 1} {phase}: {phases[phase]}", flush=True)
        finally:
            worker.stop()
    return phases


def _ratios(rounds: list[dict[str, dict]], name: str) -> dict:
    """Phase `name` against alone (quiet p50) and against flood/off (throughput): the median
    of the rounds' own ratios, and their range."""
    out: dict = {}
    quiet = [r[name]["quiet_p50_ms"] / r["alone"]["quiet_p50_ms"] for r in rounds]
    key = {"flood/off": "off", "flood/on": "on", "flood/on+step": "on_step"}[name]
    out[f"quiet_p50_ratio_{key}"] = round(statistics.median(quiet), 2)
    if len(rounds) > 1:
        out[f"quiet_p50_ratio_{key}_range"] = [round(min(quiet), 2), round(max(quiet), 2)]
    if name != "flood/off":
        for figure in FIGURES:
            paired = [r[name][figure] / r["flood/off"][figure] for r in rounds]
            out[f"{figure}_{key}_over_off"] = round(statistics.median(paired), 3)
            if len(rounds) > 1:
                out[f"{figure}_{key}_over_off_range"] = [
                    round(min(paired), 3),
                    round(max(paired), 3),
                ]
    return out


def _medians(rounds: list[dict[str, dict]], name: str) -> dict:
    """A phase's figures over the rounds: the median of each (counts are summed)."""
    rows = [r[name] for r in rounds]
    if len(rows) == 1:
        return rows[0]
    out = {}
    for figure in rows[0]:
        values = [row[figure] for row in rows if row[figure] is not None]
        if figure in ("quiet_requests", "flood_requests", "fair_preemptions", "preemptions"):
            out[figure] = sum(values)
        else:
            out[figure] = round(statistics.median(values), 1) if values else None
    return out


def run_http(args) -> dict:
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        raise SystemExit(
            "bench fairness --http drives the distributed mode: set DATABASE_URL to PostgreSQL "
            "and REDIS_URL"
        )
    model, quiet_key, flood_key = _setup(args.preset)
    namespace = f"benchfair{random.randrange(1 << 30)}-"
    server = AsgiServer(_env(args, args.extra, namespace))  # one API process for every phase
    try:
        rounds = [
            _round(args, server, model, quiet_key, flood_key, namespace, index)
            for index in range(args.rounds)
        ]
    finally:
        server.stop()
    names = ["alone"] + [name for name, _, _ in _configs(args)]
    phases = {name: _medians(rounds, name) for name in names}
    result = {
        "bench": "fairness-http",
        "preset": args.preset,
        "slots": args.slots,
        "extra": args.extra,
        "step_share": args.step_share,
        "quiet_clients": args.quiet_clients,
        "flood_clients": args.flood_clients,
        "rounds": args.rounds,
        "phases": phases,
        **{k: v for name in names[1:] for k, v in _ratios(rounds, name).items()},
        "loadavg": Path("/proc/loadavg").read_text().split()[:3]
        if Path("/proc/loadavg").exists()
        else None,
    }
    if args.rounds > 1:
        result["each_round"] = rounds
    _print(result)
    return result


def _print(result: dict) -> None:
    print(
        f"fairness inside the batch, over HTTP: {result['preset']}, one worker of "
        f"{result['slots']} slots (+{result['extra']} for fairness"
        f"{', step share' if result['step_share'] else ''}), quiet tenant "
        f"{result['quiet_clients']} clients, flood {result['flood_clients']} clients"
    )
    print(
        f"{'phase':<14}{'quiet p50':>11}{'p95':>9}{'ttft p50':>10}{'x alone':>9}"
        f"{'out tok/s':>11}{'all tok/s':>11}{'req/s':>8}{'fair preempt':>14}"
    )
    alone = result["phases"]["alone"]["quiet_p50_ms"]
    for name, row in result["phases"].items():
        print(
            f"{name:<14}{row['quiet_p50_ms']:>9.0f}ms{row['quiet_p95_ms']:>7.0f}ms"
            f"{row['quiet_ttft_p50_ms']:>8.0f}ms{row['quiet_p50_ms'] / alone:>8.2f}x"
            f"{row['output_tokens_per_s']:>11.0f}{row['processed_tokens_per_s']:>11.0f}"
            f"{row['requests_per_s']:>8.1f}{row['fair_preemptions']:>14}"
        )
    rounds = result["rounds"]
    if rounds > 1:
        print(f"medians of {rounds} rounds; ratios: the median of the rounds' own, [range]")

    def ranged(key: str, digits: int) -> str:
        spread = result.get(f"{key}_range")
        text = f"{result[key]:.{digits}f}x"
        return text + (f" [{spread[0]:.{digits}f}-{spread[1]:.{digits}f}]" if spread else "")

    print(
        f"quiet p50 under the flood: {ranged('quiet_p50_ratio_off', 2)} alone without "
        f"fairness inside the batch, {ranged('quiet_p50_ratio_on', 2)} with it (goal <= 1.8x); "
        f"with it against without: tokens processed (prompt + output) "
        f"{ranged('processed_tokens_per_s_on_over_off', 3)} (goal >= 0.95), output tokens "
        f"{ranged('output_tokens_per_s_on_over_off', 3)}, requests "
        f"{ranged('requests_per_s_on_over_off', 3)}"
    )
    if "quiet_p50_ratio_on_step" in result:
        print(
            f"with the step share too: quiet p50 {ranged('quiet_p50_ratio_on_step', 2)} alone; "
            f"tokens processed {ranged('processed_tokens_per_s_on_step_over_off', 3)} of "
            f"fairness off, output tokens {ranged('output_tokens_per_s_on_step_over_off', 3)}"
        )


def run(argv: list[str] | None = None) -> dict:
    """`bench fairness --http` (routing/management/commands/bench.py sends it here)."""
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench fairness --http",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--http", action="store_true", help="(this scenario)")
    p.add_argument("--quick", action="store_true", help="6 measured seconds per phase")
    p.add_argument("--preset", "--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--slots", type=int, default=8, help="the worker's sequence slots")
    p.add_argument("--extra", type=int, default=4, help="FAIRLANE_FAIR_EXTRA_SLOTS when on")
    p.add_argument("--quiet-clients", type=int, default=3)
    p.add_argument("--flood-clients", type=int, default=48)
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--quiet-tokens", type=int, default=16, help="max_tokens of the quiet")
    p.add_argument("--flood-tokens", type=int, default=64, help="max_tokens of the flood")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    p.add_argument(
        "--step-share",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FAIRLANE_ENGINE_FAIR_STEP_SHARE in the worker with fairness on (the flood runs at "
        "most its share of each step while the quiet tenant runs); default: the setting's "
        "default (on on the CPU)",
    )
    p.add_argument(
        "--with-step-share",
        action="store_true",
        help="fairness on both without (flood/on) and with the step share (flood/on+step), "
        "in the same rounds",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of every phase, the configurations' order rotated each round",
    )
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "fairness-http.json")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.with_step_share:
        args.step_share = False  # flood/on: without it; flood/on+step: with it
    elif args.step_share is None:
        args.step_share = settings.FAIRLANE_ENGINE_FAIR_STEP_SHARE
    if args.quick:
        args.seconds = min(args.seconds, 6.0)
    result = run_http(args)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
