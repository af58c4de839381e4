"""`python manage.py bench fairness`: the fair queue against first come, first served, in one
run, on the real Redis queue (every enqueue, dequeue and charge is the real Lua script).

Workers are simulated on a virtual clock: a request occupies one of `--slots` sequence slots
for (input tokens x 0.1 + output tokens) token-times of 10 ms, and its output tokens are
charged to its tenant in batches of 16 as they are "generated", as a real worker does. So the
figures are about the queue, not about this machine's speed. Scenarios:

  tenants: A and B (weight 1) and C (weight 2) backlogged, plus F (weight 1) flooding 10x as
           much. Jain's index of weight-normalised service over the backlogged interval, the
           largest service gap between two backlogged tenants against VTC's bound
           2 * max(L_input, M), queue waits p50/p99 per tenant, utilisation.
  lanes:   realtime at 30 % of capacity while bulk is backlogged at 10x capacity, one slot
           kept for realtime as workers do: realtime queue wait p50/p99 (goal: p99 under 1 s).
  engine:  the same tenants against a real engine (the tiny preset) pulling from the fair
           queue for a few seconds: Jain's index of the tokens it actually served.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from workers.fairqueue import FairQueue

TOKEN_SECONDS = 0.010  # one output token of service, in simulated seconds
PREFILL_FACTOR = 0.1  # an input token costs a tenth of an output token
CHARGE_EVERY = 16


@dataclass
class Tenant:
    name: str
    weight: int
    rate: float  # requests per simulated second
    lane: str = "standard"


@dataclass(order=True)
class Request:
    arrival: float
    id: str = field(compare=False)
    tenant: str = field(compare=False)
    lane: str = field(compare=False)
    input_tokens: int = field(compare=False)
    output_tokens: int = field(compare=False)


class Fcfs:
    """The baseline: one Redis list, first come, first served."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client, self.key = client, f"bench:fcfs:{name}"
        self.payloads: dict[str, dict] = {}

    def enqueue(self, *, id, tenant, lane, weight, cost, payload) -> None:
        self.payloads[id] = payload
        self.client.rpush(self.key, id)

    def dequeue(self, *, worker, realtime_only=False):
        raw = self.client.lpop(self.key)
        return None if raw is None else _Taken(self.payloads.pop(raw.decode()))

    def charge(self, **kwargs) -> None:
        pass

    def ack(self, **kwargs) -> None:
        pass

    def clear(self) -> None:
        self.client.delete(self.key)


@dataclass
class _Taken:
    payload: dict


def workload(
    tenants: list[Tenant],
    *,
    duration: float,
    seed: int,
    input_range=(32, 256),
    output_range=(32, 256),
) -> list[Request]:
    rng = random.Random(seed)
    requests = []
    for tenant in tenants:
        t = 0.0
        while True:
            t += rng.expovariate(tenant.rate)
            if t >= duration:
                break
            requests.append(
                Request(
                    t,
                    uuid.uuid4().hex,
                    tenant.name,
                    tenant.lane,
                    rng.randint(*input_range),
                    rng.randint(*output_range),
                )
            )
    return sorted(requests)


def simulate(
    queue,
    tenants: list[Tenant],
    requests: list[Request],
    *,
    slots: int,
    until: float,
    reserved: int = 0,
) -> dict:
    """Discrete-event run: arrivals enqueue, free slots dequeue (the last `reserved` ones for
    realtime only, as workers do), service charges as it goes."""
    weights = {t.name: t.weight for t in tenants}
    served = {t.name: 0.0 for t in tenants}  # tokens served: input + output
    waits: dict[str, list[float]] = {t.name: [] for t in tenants}
    events = [(r.arrival, i, "arrive", r) for i, r in enumerate(requests)]
    heapq.heapify(events)
    order = len(events)
    free, waiting, busy, idle_while_waiting, gap, last = slots, 0, 0.0, 0.0, 0.0, 0.0
    everyone_arrived = max(min(r.arrival for r in requests if r.tenant == t.name) for t in tenants)
    backlogged_at = None
    while events and events[0][0] <= until:
        now, _, kind, data = heapq.heappop(events)
        if free > reserved and waiting:  # idle while work waited: not work-conserving
            idle_while_waiting += (now - last) * min(free - reserved, waiting)
        last = now
        if kind == "arrive":
            waiting += 1
            queue.enqueue(
                id=data.id,
                tenant=data.tenant,
                lane=data.lane,
                weight=weights[data.tenant],
                cost=data.input_tokens,
                payload={
                    "id": data.id,
                    "arrival": data.arrival,
                    "tenant": data.tenant,
                    "input": data.input_tokens,
                    "output": data.output_tokens,
                    "lane": data.lane,
                },
            )
        elif kind == "charge":
            tenant, lane, tokens = data
            queue.charge(tenant=tenant, lane=lane, tokens=tokens)
            served[tenant] += tokens
        else:
            free += 1
            queue.ack(id=data, worker="sim")
        while free and waiting:
            taken = queue.dequeue(worker="sim", realtime_only=free <= reserved)
            if taken is None:
                break
            job = taken.payload
            waiting, free = waiting - 1, free - 1
            waits[job["tenant"]].append(now - job["arrival"])
            served[job["tenant"]] += job["input"]
            start = now + job["input"] * PREFILL_FACTOR * TOKEN_SECONDS
            for done in range(0, job["output"], CHARGE_EVERY):
                tokens = min(CHARGE_EVERY, job["output"] - done)
                heapq.heappush(
                    events,
                    (
                        start + (done + tokens) * TOKEN_SECONDS,
                        order,
                        "charge",
                        (job["tenant"], job["lane"], tokens),
                    ),
                )
                order += 1
            end = start + job["output"] * TOKEN_SECONDS
            busy += min(end, until) - now
            heapq.heappush(events, (end, order, "finish", job["id"]))
            order += 1
        if backlogged_at is None and now >= everyone_arrived:
            backlogged_at = dict(served)  # from here on every tenant has work waiting
        if backlogged_at is not None:
            normalised = [
                (served[t.name] - backlogged_at[t.name]) / weights[t.name] for t in tenants
            ]
            gap = max(gap, max(normalised) - min(normalised))
    return {
        "served": served,
        "waits": waits,
        "utilisation": busy / (slots * until),
        "idle_slot_seconds_while_waiting": idle_while_waiting,
        "max_gap": gap,
    }


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(result: dict, tenants: list[Tenant]) -> dict:
    weights = {t.name: t.weight for t in tenants}
    normalised = {name: s / weights[name] for name, s in result["served"].items()}
    total = sum(result["served"].values()) or 1.0
    return {
        "jain_index": round(jain([normalised[t.name] for t in tenants if t.lane == "standard"]), 4),
        "max_service_gap": round(result["max_gap"], 1),
        "utilisation": round(result["utilisation"], 4),
        "idle_slot_seconds_while_waiting": round(result["idle_slot_seconds_while_waiting"], 3),
        "tenants": {
            name: {
                "weight": weights[name],
                "share": round(s / total, 4),
                "wait_p50_s": round(_pct(result["waits"][name], 0.5), 3),
                "wait_p99_s": round(_pct(result["waits"][name], 0.99), 3),
                "requests": len(result["waits"][name]),
            }
            for name, s in result["served"].items()
        },
    }


def scenario_tenants(client, *, slots: int, duration: float, seed: int) -> dict:
    # Capacity: slots / mean service (~1.5 s) ~ slots * 0.6 requests/s; every tenant sends
    # more than its fair share, so all four stay backlogged, and F sends 10x as much.
    base = slots * 0.6 / 2
    tenants = [
        Tenant("A", 1, base),
        Tenant("B", 1, base),
        Tenant("C", 2, base),
        Tenant("F", 1, 10 * base),
    ]
    requests = workload(tenants, duration=duration, seed=seed)
    out = {}
    for name, queue in (
        ("fcfs", Fcfs(client, uuid.uuid4().hex)),
        ("fair", FairQueue(client, f"bench-{uuid.uuid4().hex}")),
    ):
        try:
            out[name] = _summary(
                simulate(queue, tenants, requests, slots=slots, until=duration), tenants
            )
        finally:
            queue.clear()
    # VTC's bound 2 * max(w_p * L_input, w_q * M), with L_input the longest prompt (256) and M
    # the most tokens a full batch holds in flight: every slot at its longest output.
    out["gap_bound"] = 2 * max(256, slots * 256)
    return out


def scenario_lanes(client, *, slots: int, duration: float, seed: int) -> dict:
    capacity = slots / 1.5
    tenants = [
        Tenant("rt", 1, 0.3 * capacity, lane="realtime"),
        Tenant("bulk", 1, 10 * capacity, lane="bulk"),
    ]
    queue = FairQueue(client, f"bench-{uuid.uuid4().hex}")
    try:
        result = simulate(
            queue,
            tenants,
            workload(tenants, duration=duration, seed=seed),
            slots=slots,
            until=duration,
            reserved=1,
        )
    finally:
        queue.clear()
    return {
        "realtime_requests": len(result["waits"]["rt"]),
        "realtime_wait_p50_s": round(_pct(result["waits"]["rt"], 0.5), 3),
        "realtime_wait_p99_s": round(_pct(result["waits"]["rt"], 0.99), 3),
        "bulk_share_of_service": round(
            result["served"]["bulk"] / sum(result["served"].values()), 4
        ),
        "utilisation": round(result["utilisation"], 4),
    }


def scenario_engine(client, *, seconds: float, seed: int, models_dir: Path) -> dict:
    """Three backlogged tenants (weights 1, 1, 2) and a flooder against the tiny preset's
    engine pulling from the fair queue: the tokens it served per tenant, normalised."""
    from workers.engine import AsyncEngine, EngineConfig, SamplingParams, ensure_preset

    engine = AsyncEngine.from_config(
        EngineConfig(model=str(ensure_preset("tiny", models_dir)), max_num_seqs=4)
    ).start()
    queue = FairQueue(client, f"bench-{uuid.uuid4().hex}")
    tenants = {"A": 1, "B": 1, "C": 2, "F": 1}
    rng = random.Random(seed)
    for name, weight in tenants.items():
        for _ in range(2000 if name == "F" else 200):  # all stay backlogged throughout
            prompt = [rng.randrange(5, 200) for _ in range(rng.randint(16, 64))]
            queue.enqueue(
                id=uuid.uuid4().hex,
                tenant=name,
                lane="standard",
                weight=weight,
                cost=len(prompt),
                payload={"prompt": prompt, "tenant": name, "out": rng.randint(16, 64)},
            )
    served = dict.fromkeys(tenants, 0)
    running: dict[str, object] = {}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            while len(running) < 4:
                taken = queue.dequeue(worker="bench")
                if taken is None:
                    break
                job = taken.payload
                served[job["tenant"]] += len(job["prompt"])
                params = SamplingParams(max_tokens=job["out"], temperature=0, ignore_eos=True)
                running[taken.id] = (
                    job,
                    engine.stream(job["prompt"], params, tenant=job["tenant"]),
                )
            for queue_id, (job, stream) in list(running.items()):
                out = next(stream, None)
                if out is None or out.finished:
                    del running[queue_id]
                    queue.ack(id=queue_id, worker="bench")
                if out is not None and out.new_token_ids:
                    served[job["tenant"]] += len(out.new_token_ids)
                    queue.charge(
                        tenant=job["tenant"], lane="standard", tokens=len(out.new_token_ids)
                    )
    finally:
        engine.shutdown()
        queue.clear()
    normalised = [served[n] / w for n, w in tenants.items()]
    total = sum(served.values())
    return {
        "seconds": seconds,
        "tokens_served": total,
        "jain_index": round(jain(normalised), 4),
        "shares": {n: round(s / total, 4) for n, s in served.items()},
    }


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="manage.py bench fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="shorter runs, under a minute")
    p.add_argument("--slots", type=int, default=8, help="simulated sequence slots")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redis-url", default=None, help="default: REDIS_URL, else localhost")
    p.add_argument(
        "--json-out",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "bench-results" / "fairness.json",
    )
    p.add_argument("--models-dir", type=Path, default=Path("var/models"))
    p.add_argument(
        "--http",
        action="store_true",
        help="fairness inside the batch over HTTP instead (routing/bench/fair_http.py: "
        "`bench fairness --http --help` for its options)",
    )
    args = p.parse_args(argv)
    if args.http:
        raise SystemExit("the HTTP scenario runs as `python manage.py bench fairness --http`")
    import os

    client = redis.Redis.from_url(
        args.redis_url or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    )
    duration = 120.0 if args.quick else 600.0
    started = time.perf_counter()
    result = {
        "bench": "fairness",
        "quick": args.quick,
        "slots": args.slots,
        "simulated_seconds": duration,
        "tenants": scenario_tenants(client, slots=args.slots, duration=duration, seed=args.seed),
        "lanes": scenario_lanes(client, slots=args.slots, duration=duration, seed=args.seed),
        "engine": scenario_engine(
            client, seconds=8.0 if args.quick else 30.0, seed=args.seed, models_dir=args.models_dir
        ),
    }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    _print(result)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


def _print(result: dict) -> None:
    t = result["tenants"]
    print(
        f"fairness bench: {result['slots']} slots, {result['simulated_seconds']:.0f} simulated "
        f"seconds on the real Redis queue (A, B weight 1; C weight 2; F weight 1 floods 10x)"
    )
    print(f"{'':6}{'tenant':>8}{'weight':>8}{'share':>8}{'wait p50':>10}{'wait p99':>10}")
    for name in ("fcfs", "fair"):
        for tenant, row in t[name]["tenants"].items():
            print(
                f"{name:6}{tenant:>8}{row['weight']:>8}{row['share']:>8.3f}"
                f"{row['wait_p50_s']:>9.2f}s{row['wait_p99_s']:>9.2f}s"
            )
    for name in ("fcfs", "fair"):
        print(
            f"{name}: Jain's index {t[name]['jain_index']:.4f}, largest service gap "
            f"{t[name]['max_service_gap']:.0f} tokens (bound {t['gap_bound']}), "
            f"utilisation {t[name]['utilisation']:.3f}"
        )
    lanes = result["lanes"]
    print(
        f"lanes: realtime wait p50 {lanes['realtime_wait_p50_s']:.2f}s p99 "
        f"{lanes['realtime_wait_p99_s']:.2f}s with bulk backlogged at 10x capacity "
        f"(bulk got {lanes['bulk_share_of_service']:.1%} of service)"
    )
    engine = result["engine"]
    print(
        f"real engine ({engine['seconds']:.0f} s, tiny preset): Jain's index "
        f"{engine['jain_index']:.4f} over {engine['tokens_served']} tokens, shares "
        f"{engine['shares']}"
    )
