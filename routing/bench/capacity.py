"""`python manage.py bench capacity`: the capacity planner's prediction against the real thing.

1. Calibrate: the real engine (the preset, as the workers start it, with `--max-num-seqs`)
   stepped over the planner's grid in this process; the step-time model fitted to it (A).
2. Calibrate through the path (the default; `--ramp 0` skips it): `--ramp` requests whose
   arrival rate rises from 0.2x to 1.4x A's saturation rate, sent through the system; the steps
   the workers themselves recorded meanwhile (under the path's own load: their runner threads,
   the API process, Redis) are fitted again (P), as `capacity_plan` fits live workers' steps.
3. Predict: the capacity of `--workers` workers (one by default) sharing the model's queue
   (their saturation rate, or with `--p95-ms` the knee: the highest rate whose p95 latency
   meets it) from P (from A with `--ramp 0`), and at `--fractions` of it (0.5, 0.8, 0.95) the
   p50/p95 TTFT and latency and the throughput, for the very arrival schedule (seeded Poisson,
   the same lengths, `--bulk-fraction` of the requests on the bulk lane) that step 4 sends.
4. Measure: the same schedule, open loop, through the real HTTP path of the distributed mode
   (uvicorn -> admission -> the Redis fair queue -> the Celery GPU workers -> the stream back;
   `--direct`: straight into an in-process AsyncEngine instead); then a backlog (`--requests`
   all sent at once), whose completions per second are the measured saturation rate: the knee
   of a run without `--p95-ms`. With `--p95-ms`, the knee measured is where the levels' p95
   latency crosses the target (interpolated between the levels that bracket it), printed
   against each fit's knee read the same way off its predictions for the same levels, and
   against the planner's search for the levels' length (`--requests` arrivals) and a long run.
The fixed latency outside the engine (the HTTP path's own) is measured first, one light
request at a time, less what each fit says the engine's steps took, and given to the
simulation as its `overhead_s`. Printed: predicted against measured with the error in per
cent, from A; from P (out of sample: no level's steps are in it); and from the steps the
workers recorded during every level (C: in sample, the simulation's own error when it has the
step times the workers had). `--ramp-again` sends the ramp once more after the levels and
predicts from its steps too (P2): where P2 and P differ, the machine changed speed during the
run. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import httpx
import torch
from django.conf import settings
from django.utils import timezone

from routing.services.capacity import lane_min_shares, mix_make, refill_from_ledger
from workers.engine import AsyncEngine, EngineConfig, SamplingParams
from workers.engine.planner import (
    Mix,
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
from workers.serving.catalog import bulk_yield

ROOT = Path(__file__).resolve().parents[2]
WARMUP = 0.1
LETTERS = {"calibration": "A", "path": "P", "path_again": "P2", "all_levels": "C"}  # as printed


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", "--model", default="tiny", help="model preset (tiny or small)")
    p.add_argument("--prompt-tokens", default="32-256", help="LOW-HIGH, uniform")
    p.add_argument("--output-tokens", default="32-96", help="LOW-HIGH, uniform")
    p.add_argument("--max-num-seqs", type=int, default=8, help="the engine's (worker's) slots")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Celery GPU workers serving the model, sharing its queue (the distributed path)",
    )
    p.add_argument("--p95-ms", type=float, default=None, help="capacity = the knee for it")
    p.add_argument(
        "--bulk-fraction",
        type=float,
        default=0.0,
        help="the share of requests on the bulk lane (sent with a second agent's key, whose "
        "lane is bulk); the rest on the standard lane",
    )
    p.add_argument("--fractions", default="0.5,0.8,0.95", help="of the predicted capacity")
    p.add_argument(
        "--rates",
        default=None,
        help="levels at these rates (req/s, comma-separated) instead of --fractions: the same "
        "load for two runs whose predicted capacities differ (an A/B of a change)",
    )
    p.add_argument("--requests", type=int, default=200, help="arrivals per level")
    p.add_argument(
        "--ramp",
        type=int,
        default=150,
        help="requests of the calibration through the path (0: none)",
    )
    p.add_argument("--no-backlog", action="store_true", help="skip the saturation level")
    p.add_argument(
        "--ramp-again", action="store_true", help="the ramp once more after the levels (P2)"
    )
    p.add_argument("--quick-calibration", action="store_true", help="the small grid")
    p.add_argument("--direct", action="store_true", help="drive an in-process engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=ROOT / "bench-results" / "capacity.json")
    return p.parse_args(argv)


class Direct:
    """Requests straight into an AsyncEngine in this process."""

    def __init__(self, model_dir: Path, args) -> None:
        self.engine = AsyncEngine.from_config(
            EngineConfig(
                model=str(model_dir),
                max_num_seqs=args.max_num_seqs,
                num_threads=args.threads,
                **bulk_yield(),  # as the workers start it
            )
        ).start()

    async def one(
        self, prompt: list[int], max_tokens: int, lane: str = "standard"
    ) -> tuple[float, float]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start, first = time.perf_counter(), None
        async for out in self.engine.generate(prompt, params, lane=lane):
            if out.new_token_ids and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return (first or end) - start, end - start

    def step_rows(self) -> dict[tuple, list]:
        return {("direct", r[4]): r for r in self.engine.stats().get("step_samples", [])}

    async def close(self) -> None:
        self.engine.shutdown()


def queue_room(args) -> int:
    """Room in the queue for every request a level, the ramp or the backlog sends at once."""
    return max(settings.FAIRLANE_MAX_QUEUE_PER_TENANT, args.requests, args.ramp)


class Distributed:
    """uvicorn (distributed mode) and `--workers` Celery GPU workers, on the configured
    PostgreSQL and Redis; streamed completions of token-id prompts, each with its lane's key."""

    def __init__(self, model: str, keys: dict[str, str], args) -> None:
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
            # A level above the knee queues up to all of its arrivals; the simulation has no
            # admission limit, so the path's must not refuse them (429) either.
            "FAIRLANE_MAX_QUEUE_PER_TENANT": str(queue_room(args)),
            "FAIRLANE_MAX_QUEUE_PER_LANE": str(
                max(settings.FAIRLANE_MAX_QUEUE_PER_LANE, queue_room(args))
            ),
            "SECRET_KEY": settings.SECRET_KEY,
            "LOG_LEVEL": "WARNING",
        }
        self.model, self.keys = model, keys  # the plain key of each lane's agent
        self.workers = [
            CeleryWorker(env, concurrency=args.max_num_seqs + 4, name=f"capacity{i}")
            for i in range(args.workers)
        ]
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
                    timeout=600,
                    # A kept connection is dropped before uvicorn's keep-alive timeout (5 s)
                    # would close it under a request just sent on it: with both at 5 s, a run
                    # of `small` (K-12) lost a request to httpx.ReadError and stopped.
                    limits=httpx.Limits(
                        max_connections=1000, max_keepalive_connections=200, keepalive_expiry=2.0
                    ),
                ),
            )
        return self._client

    async def one(
        self, prompt: list[int], max_tokens: int, lane: str = "standard"
    ) -> tuple[float, float]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        start, first = time.perf_counter(), None
        headers = {"Authorization": f"Bearer {self.keys[lane]}"}
        async with self.client.stream(
            "POST", "/v1/completions", json=body, headers=headers
        ) as response:
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
        for worker in self.workers:
            worker.stop()


def _require_distributed() -> None:
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        raise SystemExit(
            "bench capacity drives the distributed mode: set DATABASE_URL to PostgreSQL and "
            "REDIS_URL (or pass --direct to drive an in-process engine)"
        )


def _setup(preset: str):
    """A bench tenant and agents with budgets that never run out, the model enabled, and a
    key for each lane: the standard agent's and a second agent's, whose lane is bulk."""
    from tenants.models import Agent, Budget, Lane, Scope, Tenant
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
    bulk = Agent.objects.filter(tenant=tenant, name="bench-capacity-bulk").first() or agent_create(
        tenant=tenant, name="bench-capacity-bulk", lane=Lane.BULK
    )
    for owner in (None, agent, bulk):
        if not Budget.objects.filter(tenant=tenant, agent=owner).exists():
            budget_create(tenant=tenant, agent=owner, limit_microcents=10**15)
    model = f"bench-{preset}"
    model_register(name=model, source=f"preset:{preset}", description="bench capacity")
    ServedModel.objects.filter(name=model).update(is_enabled=True)
    keys = {
        lane: api_key_create(
            tenant=tenant, agent=owner, name=f"bench capacity {lane}", scopes=[Scope.INFERENCE]
        )
        for lane, owner in ((Lane.STANDARD.value, agent), (Lane.BULK.value, bulk))
    }
    return model, keys


async def _drive(
    system, schedule: list[tuple[float, list[int], int, str]], rows: dict[tuple, list]
) -> list[tuple]:
    """Send each request at its arrival time (open loop); (arrival, ttft, e2e, end, lane) each.
    Meanwhile the steps the engine records are gathered into `rows` (it keeps only its last
    ones)."""
    start = time.perf_counter()
    is_running = True

    async def gather_steps() -> None:
        while is_running:
            rows.update(await asyncio.to_thread(system.step_rows))
            await asyncio.sleep(0.5)

    async def one(at: float, prompt: list[int], output: int, lane: str) -> tuple:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        sent = time.perf_counter()
        ttft, e2e = await system.one(prompt, output, lane)
        return sent - start, ttft, e2e, sent - start + e2e, lane

    gathering = asyncio.create_task(gather_steps())
    results = list(await asyncio.gather(*(one(*job) for job in schedule)))
    await asyncio.sleep(1.5)  # the last heartbeat
    is_running = False
    await gathering
    rows.update(system.step_rows())
    return results


def _measured(results: list[tuple], outputs: list[int], *, is_backlog: bool = False) -> dict:
    """The figures the simulation predicts, over the requests after the first WARMUP share;
    throughput over the arrivals' span, or for a backlog (everything sent at once) over the
    middle of the completions, as the simulation counts them."""
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
    if is_backlog:  # sent at once (the sends themselves spread over some milliseconds)
        ends = sorted(r[3] for r in results)
        begin, end = ends[len(ends) // 10], ends[(len(ends) * 9) // 10]
    done = [i for i, r in enumerate(results) if begin <= r[3] <= end]
    by_lane: dict[str, list[float]] = {}
    for r in measured:
        by_lane.setdefault(r[4], []).append(r[1])
    return {
        "ttft_p95_by_lane": {k: percentile(sorted(v), 0.95) for k, v in sorted(by_lane.items())},
        "ttft_p50": percentile(ttft, 0.5),
        "ttft_p95": percentile(ttft, 0.95),
        "e2e_p50": percentile(e2e, 0.5),
        "e2e_p95": percentile(e2e, 0.95),
        "throughput_rps": len(done) / (end - begin),
        "output_tok_s": sum(outputs[i] for i in done) / (end - begin),
        "itl_p50": percentile(itl, 0.5),
    }


def _schedule(mix: Mix, rate: float, n: int, seed: int) -> list[tuple[float, list[int], int, str]]:
    """(arrival, prompt, output tokens, lane) of each request, as the simulation draws them."""
    rng = random.Random(seed + 99)
    return [
        (r.arrival, [rng.randint(37, 131) for _ in range(r.prompt)], r.output, LANES[r.lane])
        for r in arrivals_draw(mix, rate, n, seed, LANES)  # the prompts: ASCII bytes
    ]


def _ramp(
    mix: Mix, low: float, high: float, n: int, seed: int
) -> list[tuple[float, list, int, str]]:
    """``n`` requests of the mix, Poisson, the rate rising linearly from ``low`` to ``high``/s:
    steps of every batch size, from one sequence to a full engine with a queue."""
    gaps, at, ramp = random.Random(seed + 5), 0.0, []
    for i, (_, prompt, output, lane) in enumerate(_schedule(mix, 1.0, n, seed)):
        at += gaps.expovariate(low + (high - low) * i / max(n - 1, 1))
        ramp.append((at, prompt, output, lane))
    return ramp


def _light(system, seed: int) -> list[tuple[float, float]]:
    """Light requests (64 prompt tokens, 2 output tokens) one at a time: (ttft, e2e) each,
    the first two (warming the path) left out."""
    rng = random.Random(seed + 7)
    timings = []
    for _ in range(10):
        prompt = [rng.randint(37, 131) for _ in range(64)]
        timings.append(asyncio.run(system.one(prompt, 2)))
    return timings[2:]


def _overhead(light: list[tuple[float, float]], model: StepTimeModel) -> tuple[float, float]:
    """The path's own latency before the first token and after the last: the light requests'
    times less the steps ``model`` says the engine took for them."""
    before = [ttft - model.seconds(64, 0, 0) for ttft, _ in light]
    after = [e2e - ttft - model.seconds(0, 1, 66) for ttft, e2e in light]
    return max(statistics.median(before), 0.0), max(statistics.median(after), 0.0)


def _fit_print(
    name: str, fit: StepTimeModel, shape: ServerShape, capacity: float, kind: str
) -> None:
    print(
        f"  {name}: {fit.num_samples} steps, {fit.base * 1e3:.3f} ms + "
        f"{fit.per_prefill_token * 1e6:.2f} us/prefill token + {fit.per_decode_seq * 1e6:.2f} "
        f"us/decode + {fit.per_context_token * 1e9:.2f} ns/context token (median error "
        f"{fit.median_rel_error:.0%}); outside the engine {shape.overhead_s * 1e3:.1f} ms before "
        f"the first token, {shape.tail_s * 1e3:.1f} ms after the last; predicted {kind}: "
        f"{capacity:.2f} req/s"
    )


def _row(level: float | None, rate: float, predicted, measured: dict) -> dict:
    """One level's figures; a backlog's fraction and rate are None (all sent at once)."""
    row = {"fraction": level, "rate": rate if math.isfinite(rate) else None}
    for name in ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "throughput_rps", "itl_p50"):
        guess, real = getattr(predicted, name), measured[name]
        row[name] = {
            "predicted": guess,
            "measured": real,
            "error_pct": 100 * (guess - real) / real if real else None,
        }
    row["ttft_p95_by_lane"] = {
        lane: {"predicted": predicted.ttft_p95_by_lane.get(lane), "measured": real}
        for lane, real in measured["ttft_p95_by_lane"].items()
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
        load = (
            "backlog     "
            if row["fraction"] is None
            else (f"{row['fraction']:4.0%} {row['rate']:7.2f}")
        )
        lanes = row["ttft_p95_by_lane"]
        by_lane = (
            "  TTFT p95 by lane: "
            + ", ".join(
                f"{lane} {c['predicted'] * 1e3:.0f}/{c['measured'] * 1e3:.0f}"
                for lane, c in lanes.items()
                if c["predicted"] is not None
            )
            if len(lanes) > 1
            else ""
        )
        print(f"  {load} | " + " | ".join(cells) + by_lane)


def knee_measured(levels: list[tuple[float, float]], target: float) -> tuple[float | None, str]:
    """Where the measured p95 latency crosses ``target``, from (rate, p95) levels: the rate
    interpolated linearly between the last level that meets it and the first that misses it,
    and "within". Outside the levels: (None, "above") when every level meets it (the knee is
    above the highest rate), (None, "below") when the lowest already misses it. A level that
    meets the target above one that missed it (noise) counts as missed: the knee is the first
    crossing."""
    ordered = sorted(levels)
    if not ordered or ordered[0][1] > target:
        return None, "below"
    for (r1, p1), (r2, p2) in zip(ordered, ordered[1:], strict=False):
        if p2 > target:
            return r1 + (target - p1) / (p2 - p1) * (r2 - r1), "within"
    return None, "above"


def _knee_report(measured_levels: list, fits: dict, rows: dict, mix: Mix, targets: Targets, args):
    """The p95 target's knee measured between the levels against each fit's: read off the
    fit's predictions for the very same levels (the same schedules and interpolation: a p95 of
    a few hundred arrivals moves with the draw, and each level has its own), and by the
    planner's search, for the levels' length (``--requests`` arrivals) and for a long steady
    run (what `capacity_plan` tells an operator). ``rows``: each fit's level rows. Printed and
    returned for the JSON."""
    target = targets.e2e_p95
    assert target is not None, "only with --p95-ms"
    rated = [(rate, m["e2e_p95"]) for _, rate, _, m in measured_levels if math.isfinite(rate)]
    knee, where = knee_measured(rated, target)
    report: dict = {"target_ms": target * 1e3, "measured_rps": knee, "measured_where": where}
    span = f"{min(r for r, _ in rated):.2f}-{max(r for r, _ in rated):.2f}" if rated else "none"

    def text(rate: float | None, at: str) -> str:
        return f"{rate:.2f}" if rate is not None else f"{at} the levels ({span} req/s)"

    predicted = {}
    for name, (step_model, fit_shape) in fits.items():
        at_levels, at = knee_measured(
            [(row["rate"], row["e2e_p95"]["predicted"]) for row in rows[name] if row["rate"]],
            target,
        )
        search = {
            "levels_length_rps": capacity_search(
                step_model,
                fit_shape,
                mix,
                targets,
                num_requests=args.requests,
                seed=args.seed,
                steady=False,
            ),
            "steady_rps": capacity_search(step_model, fit_shape, mix, targets, seed=args.seed),
        }
        predicted[LETTERS[name]] = {
            "at_levels_rps": at_levels,
            "at_levels_where": at,
            "error_pct": 100 * (at_levels - knee) / knee if knee and at_levels else None,
            **search,
        }
    report["predicted"] = predicted
    print(
        f"  the knee for p95 {target * 1e3:g} ms between the levels: measured {text(knee, where)}"
    )
    for letter, p in predicted.items():
        error = f" ({p['error_pct']:+.0f}%)" if p["error_pct"] is not None else ""
        print(
            f"    {letter}: at the same levels {text(p['at_levels_rps'], p['at_levels_where'])}"
            f"{error}; by the search, {args.requests} arrivals {p['levels_length_rps']:.2f}, "
            f"a steady run {p['steady_rps']:.2f} req/s"
        )
    return report


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
    mix = mix_make(
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        bulk_fraction=args.bulk_fraction,
    )
    beside = bulk_yield()  # the bulk lane gives way, as the workers' engines are configured
    shape = ServerShape(
        num_workers=args.workers,
        max_num_seqs=args.max_num_seqs,
        yield_lanes=beside.get("yield_lanes", ()),
        bulk_beside=beside.get("yield_max_seqs", 1),
    )
    if not args.direct:  # the fair queue and the worker's puller, as their settings have them
        shape = replace(
            shape,
            reserved_slots=settings.FAIRLANE_REALTIME_RESERVED_SLOTS,
            min_shares=lane_min_shares(),
        )
    targets = Targets(e2e_p95=args.p95_ms / 1000 if args.p95_ms else None)
    if not args.direct:
        _require_distributed()
    elif args.workers != 1:
        raise SystemExit("--workers drives Celery workers: the distributed path, not --direct")
    model, keys = (None, {}) if args.direct else _setup(args.preset)
    system = (
        Direct(path, args)
        if args.direct
        else Distributed(model, {lane: plain for lane, (_, plain) in keys.items()}, args)
    )

    def fitted(step_model: StepTimeModel) -> tuple[ServerShape, float]:
        """The shape with the path's latency outside the engine by this fit, and the knee."""
        before, after = _overhead(light, step_model)
        fitted_shape = replace(shape, overhead_s=before, tail_s=after)
        return fitted_shape, capacity_search(step_model, fitted_shape, mix, targets, seed=args.seed)

    try:
        light = _light(system, args.seed)
        shape_a, capacity_a = fitted(fit)
        kind = _capacity_kind(args.p95_ms)
        print(
            f"capacity bench: {args.preset}, {args.workers} worker(s) of max_num_seqs "
            f"{args.max_num_seqs}, "
            f"{args.threads} thread(s), {'direct' if args.direct else 'HTTP, distributed'}; "
            f"prompts {args.prompt_tokens}, outputs {args.output_tokens} tokens; reserved "
            f"slots {shape.reserved_slots}; capacity = {kind}"
            + (f"; {args.bulk_fraction:.0%} on the bulk lane" if args.bulk_fraction else "")
        )
        _fit_print(
            f"A. the calibration in this process ({calibration_s:.0f} s)",
            fit,
            shape_a,
            capacity_a,
            kind,
        )
        fits: dict[str, tuple[StepTimeModel, ServerShape]] = {"calibration": (fit, shape_a)}
        capacity = capacity_a
        if args.ramp:
            ramp_rows: dict[tuple, list] = {}
            # Around A's saturation (its knee may be far below it, or 0, with --p95-ms).
            top_a = capacity_search(fit, shape_a, mix, Targets(), seed=args.seed)
            low, high = 0.2 * top_a, 1.4 * top_a
            ramp = _ramp(mix, low, high, args.ramp, args.seed + 5)
            before = set(system.step_rows())  # the light requests' steps
            started, ramp_from = time.perf_counter(), timezone.now()
            asyncio.run(_drive(system, ramp, ramp_rows))
            ramp_s = time.perf_counter() - started
            path_fit = step_model_fit(
                StepSample.from_row(r) for k, r in ramp_rows.items() if k not in before
            )
            if model is not None:  # the worker's refill of a freed slot, from the ramp's ledger
                full = shape.max_num_seqs - shape.reserved_slots
                shape = replace(
                    shape,
                    refill_s=refill_from_ledger(
                        model=model, full=full, since=ramp_from, until=timezone.now()
                    ),
                )
            shape_p, capacity = fitted(path_fit)
            fits["path"] = (path_fit, shape_p)
            _fit_print(
                f"P. the workers' steps during {args.ramp} requests through the path, "
                f"{low:.2f} to {high:.2f} req/s ({ramp_s:.0f} s; a full worker's freed slot "
                f"empty {shape.refill_s * 1e3:.1f} ms)",
                path_fit,
                shape_p,
                capacity,
                kind,
            )
        if capacity <= 0:
            raise SystemExit("the targets are missed even at a light load: no knee to measure")
        print(f"  levels at fractions of {capacity:.2f} req/s ({'P' if args.ramp else 'A'})")
        step_rows: dict[tuple, list] = {}
        before = set(system.step_rows())  # the light requests' and the ramp's steps
        fractions = (
            [(float(r) / capacity, float(r)) for r in args.rates.split(",")]
            if args.rates
            else [(float(f), float(f) * capacity) for f in args.fractions.split(",")]
        )
        levels = [
            (fraction, rate, args.seed + 10 * (i + 1))
            for i, (fraction, rate) in enumerate(fractions)
        ]
        if not args.no_backlog:
            levels.append((None, math.inf, args.seed + 10 * (len(levels) + 1)))
        measured_levels = []
        for fraction, rate, seed in levels:
            schedule = _schedule(mix, rate, args.requests, seed)
            results = asyncio.run(_drive(system, schedule, step_rows))
            outputs = [job[2] for job in schedule]
            measured = _measured(results, outputs, is_backlog=not math.isfinite(rate))
            measured_levels.append((fraction, rate, seed, measured))
        if args.ramp_again and args.ramp:  # did the machine change speed meanwhile?
            again_rows: dict[tuple, list] = {}
            before_again = set(system.step_rows())
            asyncio.run(_drive(system, ramp, again_rows))
            again_fit = step_model_fit(
                StepSample.from_row(r) for k, r in again_rows.items() if k not in before_again
            )
            shape_again, capacity_again = fitted(again_fit)
            _fit_print(
                "P2. the same ramp after the levels", again_fit, shape_again, capacity_again, kind
            )
            fits["path_again"] = (again_fit, shape_again)
        level_samples = [StepSample.from_row(r) for k, r in step_rows.items() if k not in before]
        if len(level_samples) >= 4:
            all_fit = step_model_fit(level_samples)
            fits["all_levels"] = (all_fit, fitted(all_fit)[0])
        report = {}
        titles = {
            "calibration": "A. predicted from the calibration in this process",
            "path": "P. predicted from the workers' steps through the path, before the levels "
            "(out of sample)",
            "path_again": "P2. predicted from the workers' steps during the same ramp after the "
            "levels (the machine's drift: P2 against P)",
            "all_levels": "C. predicted from the workers' steps during every level (in sample: "
            "the simulation's own error given the step times)",
        }
        for name, (step_model, fit_shape) in fits.items():
            rows = [
                _row(
                    fraction,
                    rate,
                    simulate(step_model, fit_shape, mix, rate, num_requests=args.requests, seed=s),
                    measured,
                )
                for fraction, rate, s, measured in measured_levels
            ]
            saturation = capacity_search(step_model, fit_shape, mix, Targets(), seed=args.seed)
            _print(rows, f"  {titles[name]} / measured:")
            report[name] = {
                "step_model": step_model.to_dict(),
                "overhead_s": fit_shape.overhead_s,
                "tail_s": fit_shape.tail_s,
                "refill_s": fit_shape.refill_s,
                "saturation_rps": saturation,
                "levels": rows,
            }
        knee = (
            _knee_report(
                measured_levels,
                fits,
                {name: r["levels"] for name, r in report.items()},
                mix,
                targets,
                args,
            )
            if args.p95_ms
            else None
        )
        top = max(m["throughput_rps"] for *_, m in measured_levels)
        backlog = measured_levels[-1][3]["throughput_rps"] if not args.no_backlog else None
        print(
            "  measured saturation (the backlog's completions/s): "
            + (f"{backlog:.2f} req/s" if backlog else "not run")
            + "; predicted: "
            + ", ".join(
                f"{LETTERS[name]} {r['saturation_rps']:.2f}"
                + (f" ({100 * (r['saturation_rps'] - backlog) / backlog:+.0f}%)" if backlog else "")
                for name, r in report.items()
            )
        )
    finally:
        asyncio.run(system.close())
        if keys:
            from tenants.services.keys import api_key_revoke
            from workers.models import ServedModel

            for key, _ in keys.values():
                api_key_revoke(key=key)
            ServedModel.objects.filter(name=model).update(is_enabled=False)
    result = {
        "bench": "capacity",
        "preset": args.preset,
        "path": "direct" if args.direct else "http-distributed",
        "max_num_seqs": args.max_num_seqs,
        "workers": args.workers,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "requests_per_level": args.requests,
        "ramp_requests": args.ramp,
        "ramp_again": bool(args.ramp_again and args.ramp),
        "reserved_slots": shape.reserved_slots,
        "bulk_fraction": args.bulk_fraction,
        "capacity_rps": capacity,
        "capacity_from": "path" if args.ramp else "calibration",
        "fits": report,
        "measured_saturation_rps": backlog,
        "knee_p95": knee,
        "measured_top_throughput_rps": top,
        "load_average": os.getloadavg()[0],
    }
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
