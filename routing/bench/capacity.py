"""`python manage.py bench capacity`: the capacity planner's prediction against the real thing.

1. Calibrate: the real engine (the preset, as the workers start it, with `--max-num-seqs`)
   stepped over the planner's grid in this process; the step-time model fitted to it.
2. Predict: one worker's capacity (its saturation rate, or with `--p95-ms` the knee: the
   highest rate whose p95 latency meets it), and at `--fractions` of it (0.5, 0.8, 0.95) the
   p50/p95 TTFT and latency and the throughput, for the very arrival schedule (seeded Poisson,
   the same lengths) that step 3 sends.
3. Measure: the same schedule, open loop, through the real HTTP path of the distributed mode
   (uvicorn -> admission -> the Redis fair queue -> one Celery GPU worker -> the stream back;
   `--direct`: straight into an in-process AsyncEngine instead).
The fixed latency outside the engine (the HTTP path's own) is measured first, one light
request at a time, and given to the simulation as its `overhead_s`. Printed: predicted
against measured with the error in per cent (A); then the same predictions from the steps
the worker itself recorded (what `capacity_plan` reads without --calibrate), during the
first level only (B: out of sample for the later levels) and during all of them (C: in
sample, the simulation's own error when it has the step times the worker had). The last
line is one JSON object.
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
from dataclasses import replace
from pathlib import Path

import httpx
import torch
from django.conf import settings

from workers.engine import AsyncEngine, EngineConfig, SamplingParams
from workers.engine.planner import (
    Mix,
    RequestClass,
    ServerShape,
    StepSample,
    StepTimeModel,
    Targets,
    capacity_search,
    simulate,
    step_model_fit,
)
from workers.engine.planner.calibrate import QUICK, Grid, calibrate
from workers.engine.planner.simulate import LANES, arrivals_draw, percentile

ROOT = Path(__file__).resolve().parents[2]
WARMUP = 0.1


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="manage.py bench capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="tiny", help="model preset (tiny or small)")
    p.add_argument("--prompt-tokens", default="32-256", help="LOW-HIGH, uniform")
    p.add_argument("--output-tokens", default="32-96", help="LOW-HIGH, uniform")
    p.add_argument("--max-num-seqs", type=int, default=8, help="the engine's (worker's) slots")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument("--p95-ms", type=float, default=None, help="capacity = the knee for it")
    p.add_argument("--fractions", default="0.5,0.8,0.95", help="of the predicted capacity")
    p.add_argument("--requests", type=int, default=200, help="arrivals per level")
    p.add_argument("--quick-calibration", action="store_true", help="the small grid")
    p.add_argument("--direct", action="store_true", help="drive an in-process engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "capacity.json")
    return p.parse_args(argv)


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


class Direct:
    """Requests straight into an AsyncEngine in this process."""

    def __init__(self, model_dir: Path, args) -> None:
        self.engine = AsyncEngine.from_config(
            EngineConfig(
                model=str(model_dir), max_num_seqs=args.max_num_seqs, num_threads=args.threads
            )
        ).start()

    async def one(self, prompt: list[int], max_tokens: int) -> tuple[float, float]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start, first = time.perf_counter(), None
        async for out in self.engine.generate(prompt, params):
            if out.new_token_ids and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return (first or end) - start, end - start

    def step_rows(self) -> dict[tuple, list]:
        return {("direct", r[4]): r for r in self.engine.stats().get("step_samples", [])}

    async def close(self) -> None:
        self.engine.shutdown()


class Distributed:
    """uvicorn (distributed mode) and one Celery GPU worker, on the configured PostgreSQL and
    Redis; streamed completions of token-id prompts."""

    def __init__(self, model: str, key: str, args) -> None:
        from routing.bench.processes import AsgiServer, CeleryWorker

        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
            "DJANGO_SETTINGS_MODULE": "settings",
            "FAIRLANE_ENGINE_MODE": "distributed",
            "FAIRLANE_ENGINE_MAX_NUM_SEQS": str(args.max_num_seqs),
            "FAIRLANE_ENGINE_THREADS": str(args.threads),
            "FAIRLANE_WORKER_CONCURRENCY": str(args.max_num_seqs),
            "FAIRLANE_HEARTBEAT_SECONDS": "1",
            "SECRET_KEY": settings.SECRET_KEY,
            "LOG_LEVEL": "WARNING",
        }
        self.model, self.key = model, key
        self.worker = CeleryWorker(env, concurrency=args.max_num_seqs + 4, name="capacity")
        self.server = AsgiServer(env)
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """A client of the running event loop (each phase runs one of its own)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop, self._client = (
                loop,
                httpx.AsyncClient(
                    base_url=self.server.url,
                    headers={"Authorization": f"Bearer {self.key}"},
                    timeout=600,
                    limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
                ),
            )
        return self._client

    async def one(self, prompt: list[int], max_tokens: int) -> tuple[float, float]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        start, first = time.perf_counter(), None
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        first = time.perf_counter()
        end = time.perf_counter()
        return (first or end) - start, end - start

    def step_rows(self) -> dict[tuple, list]:
        from routing.runtimes import runtime_installed

        return {
            (w.id, row[4]): row
            for w in runtime_installed().pool.worker_states()
            for row in w.engines.get(self.model, {}).get("step_samples", [])
        }

    async def close(self) -> None:
        self.server.stop()
        self.worker.stop()


def _require_distributed() -> None:
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        raise SystemExit(
            "bench capacity drives the distributed mode: set DATABASE_URL to PostgreSQL and "
            "REDIS_URL (or pass --direct to drive an in-process engine)"
        )


def _setup(preset: str):
    """A bench tenant and agent with budgets that never run out, a key, the model enabled."""
    from tenants.models import Agent, Budget, Scope, Tenant
    from tenants.services.budgets import budget_create
    from tenants.services.keys import api_key_create
    from tenants.services.tenancy import agent_create, tenant_create
    from workers.models import ServedModel
    from workers.serving.registration import model_register

    tenant = Tenant.objects.filter(slug="bench").first() or tenant_create(
        name="Benchmarks", slug="bench", owner=None
    )
    agent = Agent.objects.filter(tenant=tenant, name="bench-capacity").first() or agent_create(
        tenant=tenant, name="bench-capacity"
    )
    for owner in (None, agent):
        if not Budget.objects.filter(tenant=tenant, agent=owner).exists():
            budget_create(tenant=tenant, agent=owner, limit_microcents=10**15)
    model = f"bench-{preset}"
    model_register(name=model, source=f"preset:{preset}", description="bench capacity")
    ServedModel.objects.filter(name=model).update(is_enabled=True)
    key, plain = api_key_create(
        tenant=tenant, agent=agent, name="bench capacity", scopes=[Scope.INFERENCE]
    )
    return model, key, plain


async def _drive(
    system, schedule: list[tuple[float, list[int], int]], rows: dict[tuple, list]
) -> list[tuple]:
    """Send each request at its arrival time (open loop); (arrival, ttft, e2e, end) each.
    Meanwhile the steps the engine records are gathered into `rows` (it keeps only its last
    ones)."""
    start = time.perf_counter()
    is_running = True

    async def gather_steps() -> None:
        while is_running:
            rows.update(await asyncio.to_thread(system.step_rows))
            await asyncio.sleep(0.5)

    async def one(at: float, prompt: list[int], output: int) -> tuple:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        sent = time.perf_counter()
        ttft, e2e = await system.one(prompt, output)
        return sent - start, ttft, e2e, sent - start + e2e

    gathering = asyncio.create_task(gather_steps())
    results = list(await asyncio.gather(*(one(*job) for job in schedule)))
    await asyncio.sleep(1.5)  # the last heartbeat
    is_running = False
    await gathering
    rows.update(system.step_rows())
    return results


def _measured(results: list[tuple], outputs: list[int]) -> dict:
    skip = int(len(results) * WARMUP)
    measured = results[skip:]
    itl = sorted(
        (r[2] - r[1]) / (n - 1)
        for r, n in zip(results[skip:], outputs[skip:], strict=True)
        if n > 1
    )
    ttft = sorted(r[1] for r in measured)
    e2e = sorted(r[2] for r in measured)
    begin, end = measured[0][0], max(r[0] for r in results)
    done = [i for i, r in enumerate(results) if begin <= r[3] <= end]
    return {
        "ttft_p50": percentile(ttft, 0.5),
        "ttft_p95": percentile(ttft, 0.95),
        "e2e_p50": percentile(e2e, 0.5),
        "e2e_p95": percentile(e2e, 0.95),
        "throughput_rps": len(done) / (end - begin),
        "output_tok_s": sum(outputs[i] for i in done) / (end - begin),
        "itl_p50": percentile(itl, 0.5),
    }


def _schedule(mix: Mix, rate: float, n: int, seed: int) -> list[tuple[float, list[int], int]]:
    rng = random.Random(seed + 99)
    return [
        (r.arrival, [rng.randint(37, 131) for _ in range(r.prompt)], r.output)  # ASCII bytes
        for r in arrivals_draw(mix, rate, n, seed, LANES)
    ]


def _overhead(system, model: StepTimeModel, seed: int) -> tuple[float, float]:
    """The path's own latency before the first token and after the last: light requests
    (64 prompt tokens, 2 output tokens) one at a time, measured minus the engine's steps."""
    rng = random.Random(seed + 7)
    before, after = [], []
    for _ in range(10):
        prompt = [rng.randint(37, 131) for _ in range(64)]
        ttft, e2e = asyncio.run(system.one(prompt, 2))
        before.append(ttft - model.seconds(64, 0, 0))
        after.append(e2e - ttft - model.seconds(0, 1, 66))
    return max(statistics.median(before[2:]), 0.0), max(statistics.median(after[2:]), 0.0)


def _row(level: float, rate: float, predicted, measured: dict) -> dict:
    row = {"fraction": level, "rate": rate}
    for name in ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "throughput_rps", "itl_p50"):
        guess, real = getattr(predicted, name), measured[name]
        row[name] = {
            "predicted": guess,
            "measured": real,
            "error_pct": 100 * (guess - real) / real if real else None,
        }
    return row


def _print(rows: list[dict], title: str) -> None:
    print(title)
    print(
        "  load  rate/s | TTFT p50 ms pred/meas (err) | TTFT p95 | latency p50 | latency p95 |"
        " throughput req/s | ms/token p50"
    )
    for row in rows:
        cells = []
        for name, scale in (
            ("ttft_p50", 1e3),
            ("ttft_p95", 1e3),
            ("e2e_p50", 1e3),
            ("e2e_p95", 1e3),
            ("throughput_rps", 1),
            ("itl_p50", 1e3),
        ):
            c = row[name]
            cells.append(
                f"{c['predicted'] * scale:.0f}/{c['measured'] * scale:.0f} ({c['error_pct']:+.0f}%)"
                if name != "throughput_rps"
                else f"{c['predicted']:.2f}/{c['measured']:.2f} ({c['error_pct']:+.0f}%)"
            )
        print(f"  {row['fraction']:4.0%} {row['rate']:7.2f} | " + " | ".join(cells))


def _capacity_kind(p95_ms: float | None) -> str:
    return f"the knee for p95 {p95_ms:g} ms" if p95_ms else "saturation"


def run(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    from workers.serving.catalog import model_dir

    path = model_dir(f"preset:{args.preset}")
    started = time.perf_counter()
    samples = calibrate(
        path,
        max_num_seqs=args.max_num_seqs,
        num_threads=args.threads,
        grid=QUICK if args.quick_calibration else Grid(),
        seed=args.seed,
    )
    fit = step_model_fit(samples)
    calibration_s = time.perf_counter() - started
    mix = Mix((RequestClass(_range(args.prompt_tokens), _range(args.output_tokens)),))
    shape = ServerShape(max_num_seqs=args.max_num_seqs)
    if not args.direct:  # the worker's puller, as the worker's settings have it
        shape = replace(
            shape,
            reserved_slots=settings.FAIRLANE_REALTIME_RESERVED_SLOTS,
            pull_interval_s=settings.FAIRLANE_PULL_INTERVAL_SECONDS,
        )
    targets = Targets(e2e_p95=args.p95_ms / 1000 if args.p95_ms else None)
    if not args.direct:
        _require_distributed()
    model, key, plain = (None, None, None) if args.direct else _setup(args.preset)
    system = Direct(path, args) if args.direct else Distributed(model, plain, args)
    try:
        overhead, tail = _overhead(system, fit, args.seed)
        shape = replace(shape, overhead_s=overhead, tail_s=tail)
        capacity = capacity_search(fit, shape, mix, targets, seed=args.seed)
        print(
            f"capacity bench: {args.preset}, max_num_seqs {args.max_num_seqs}, "
            f"{args.threads} thread(s), {'direct' if args.direct else 'HTTP, distributed'}; "
            f"prompts {args.prompt_tokens}, outputs {args.output_tokens} tokens"
        )
        print(
            f"  fit on {fit.num_samples} steps ({calibration_s:.0f} s): "
            f"{fit.base * 1e3:.3f} ms + {fit.per_prefill_token * 1e6:.2f} us/prefill token + "
            f"{fit.per_decode_seq * 1e6:.2f} us/decode + {fit.per_context_token * 1e9:.2f} "
            f"ns/context token; median error {fit.median_rel_error:.0%}"
        )
        print(
            f"  outside the engine: {overhead * 1e3:.1f} ms before the first token, "
            f"{tail * 1e3:.1f} ms after the last; reserved slots {shape.reserved_slots}; "
            "predicted capacity "
            f"{capacity:.2f} req/s ({_capacity_kind(args.p95_ms)})"
        )
        rows, levels, step_rows, first_rows = [], [], {}, {}
        fractions = [float(f) for f in args.fractions.split(",")]
        for i, fraction in enumerate(fractions):
            rate, seed = fraction * capacity, args.seed + 10 * (i + 1)
            schedule = _schedule(mix, rate, args.requests, seed)
            predicted = simulate(fit, shape, mix, rate, num_requests=args.requests, seed=seed)
            results = asyncio.run(_drive(system, schedule, step_rows))
            first_rows = first_rows or dict(step_rows)
            measured = _measured(results, [job[2] for job in schedule])
            rows.append(_row(fraction, rate, predicted, measured))
            levels.append((fraction, rate, seed, measured))
        _print(
            rows, "  A. predicted from the calibration (this process, before the run) / measured:"
        )
        refits = {}
        for name, source, title in (
            (
                "first_level",
                first_rows,
                "  B. predicted from the steps the worker recorded during the first level only"
                " (out of sample for the others)",
            ),
            (
                "all_levels",
                step_rows,
                "  C. predicted from the steps the worker recorded during every level"
                " (in sample: the simulation's own error given the step times)",
            ),
        ):
            samples_seen = [StepSample.from_row(r) for r in source.values()]
            if len(samples_seen) < 4:
                continue
            refit = step_model_fit(samples_seen)
            saturation = capacity_search(refit, shape, mix, Targets(), seed=args.seed)
            refit_rows = []
            for fraction, rate, seed, measured in levels:
                again = simulate(refit, shape, mix, rate, num_requests=args.requests, seed=seed)
                refit_rows.append(_row(fraction, rate, again, measured))
            _print(refit_rows, f"{title}, {len(samples_seen)} steps:")
            print(
                f"     fit: {refit.base * 1e3:.3f} ms + {refit.per_prefill_token * 1e6:.2f} "
                f"us/prefill token + {refit.per_decode_seq * 1e6:.2f} us/decode + "
                f"{refit.per_context_token * 1e9:.2f} ns/context token (median error "
                f"{refit.median_rel_error:.0%}); predicted saturation {saturation:.2f} req/s"
            )
            refits[name] = {
                "step_model": refit.to_dict(),
                "saturation_rps": saturation,
                "levels": refit_rows,
            }
        top = max(m["throughput_rps"] for *_, m in levels)
        print(
            f"  measured: the most completions/s of any level {top:.2f} req/s (the saturation "
            "rate where the top level's throughput fell short of its rate); calibration "
            f"predicted {capacity:.2f}"
        )
    finally:
        asyncio.run(system.close())
        if key is not None:
            from tenants.services.keys import api_key_revoke
            from workers.models import ServedModel

            api_key_revoke(key=key)
            ServedModel.objects.filter(name=model).update(is_enabled=False)
    result = {
        "bench": "capacity",
        "preset": args.preset,
        "path": "direct" if args.direct else "http-distributed",
        "max_num_seqs": args.max_num_seqs,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "requests_per_level": args.requests,
        "step_model": fit.to_dict(),
        "overhead_s": overhead,
        "tail_s": tail,
        "reserved_slots": shape.reserved_slots,
        "capacity_rps": capacity,
        "levels": rows,
        "worker_fits": refits,
        "measured_top_throughput_rps": top,
        "load_average": os.getloadavg()[0],
    }
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
