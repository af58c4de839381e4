"""A seeded discrete-event simulation of the local engine pool serving a request mix.

Poisson arrivals enter one queue ordered like the fair queue: by lane (in the order given,
the first served first), then by arrival. N workers share it; each runs the engine's loop:
a step is scheduled from the sequences it holds and the queue exactly as
``workers.engine.scheduler`` composes one (running sequences first in policy order, a prefill
chunk never taking the budget the decodes behind it need, then admissions while the token
budget and ``max_num_seqs`` allow, chunked to the budget; yielding lanes limited to
``bulk_beside`` sequences a step while another lane has work), and lasts what the step-time
model says. A request's first token comes at the end of the step that computes its last
prompt token; each later step that decodes it adds one. Arrivals during a step wait for the
next one, as they do in the engine's loop.

The worker's puller is modelled too: a worker's last ``reserved_slots`` take realtime
requests only, and a slot freed while the worker was full (its slots still waiting for a
refill counted as taken) is refilled ``refill_s`` later (the worker's acknowledgement wakes its
puller, which reads the engine between steps and hands the next request to a runner thread,
which submits it; ``refill.py`` measures the mean gap from the ledger's timelines).

Not modelled: KV-pool exhaustion and preemption (the pool is assumed large enough for
``max_num_seqs`` sequences), prefix-cache hits, speculative decoding, per-tenant virtual
token counters (one tenant per lane), and time outside the engine except a fixed
``overhead_s`` per request (HTTP, admission, the queue's transport).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass, field

from workers.engine.planner.stepmodel import StepTimeModel

LANES = ("realtime", "standard", "bulk")  # tenants.models.Lane's order (the engine imports no app)


@dataclass(frozen=True, slots=True)
class RequestClass:
    """Requests of one kind: prompt and output lengths drawn uniformly from inclusive ranges."""

    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    lane: str = "standard"
    weight: float = 1.0

    def __post_init__(self) -> None:
        for low, high in (self.prompt_tokens, self.output_tokens):
            if not 1 <= low <= high:
                raise ValueError("token ranges need 1 <= low <= high")
        if self.weight <= 0:
            raise ValueError("a class's weight must be positive")


@dataclass(frozen=True, slots=True)
class Mix:
    classes: tuple[RequestClass, ...]

    def draw(self, rng: random.Random) -> tuple[int, int, str]:
        """(prompt tokens, output tokens, lane) of one request."""
        (cls,) = rng.choices(self.classes, weights=[c.weight for c in self.classes])
        return rng.randint(*cls.prompt_tokens), rng.randint(*cls.output_tokens), cls.lane

    def mean_output_tokens(self) -> float:
        total = sum(c.weight for c in self.classes)
        return sum(c.weight * sum(c.output_tokens) / 2 for c in self.classes) / total


@dataclass(frozen=True, slots=True)
class ServerShape:
    """The pool: workers, each engine's ``max_num_seqs`` and step token budget, its yielding
    lanes, and a fixed latency outside the engine added to every request."""

    num_workers: int = 1
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    yield_lanes: tuple[str, ...] = ()
    bulk_beside: int = 1
    lanes: tuple[str, ...] = LANES
    overhead_s: float = 0.0  # before the first token (HTTP, admission, the queue, transport)
    tail_s: float = 0.0  # after the last token, until the answer ends (settlement, [DONE])
    # The worker's last slots take only this lane's requests (FAIRLANE_REALTIME_RESERVED_SLOTS).
    reserved_slots: int = 0
    reserved_lane: str = "realtime"
    # A slot freed while the worker was full (a slot still waiting for its refill counted as
    # taken) stays empty this long before its puller fills it (workers/engine/planner/refill.py
    # measures it).
    refill_s: float = 0.0
    # Each lane's minimum share of recent dispatches while a lane above it is backlogged
    # (FAIRLANE_MIN_SHARE_STANDARD, _BULK; by `lanes`), the counts decayed by `share_decay` at
    # each dispatch, as the fair queue has them. Empty: strict priority.
    min_shares: tuple[float, ...] = ()
    share_decay: float = 0.99

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("workers, max_num_seqs and the token budget must be at least 1")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Latencies in seconds over the measured requests (the first ``warmup`` left out)."""

    rate: float  # offered requests/s (inf: everything at t=0)
    num_requests: int
    ttft_p50: float
    ttft_p95: float
    e2e_p50: float
    e2e_p95: float
    e2e_mean: float
    itl_p50: float  # time per output token after the first, the median request's
    throughput_rps: float  # completions/s while requests arrived
    output_tok_s: float
    batch_seqs_mean: float
    is_saturated: bool  # the queue still grew: completions fell short of arrivals
    ttft_p95_by_lane: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


@dataclass(slots=True)
class _Request:
    arrival: float
    prompt: int
    output: int
    lane: int
    order: int
    computed: int = 0
    generated: int = 0
    first_at: float = 0.0
    done_at: float = 0.0

    @property
    def is_prefilling(self) -> bool:
        return self.computed < self.prompt


@dataclass(slots=True)
class _Worker:
    running: list[_Request] = field(default_factory=list)
    waiting: list[_Request] = field(default_factory=list)  # pulled, not yet in a step
    plan: list[tuple[_Request, int]] = field(default_factory=list)
    is_busy: bool = False
    refills: list[float] = field(default_factory=list)  # when freed slots can be taken again


def arrivals_draw(
    mix: Mix, rate: float, num_requests: int, seed: int, lanes: tuple[str, ...]
) -> list[_Request]:
    """Seeded arrivals: the same unit gaps and lengths at every rate (common random numbers,
    so a search over rates sees a smooth curve)."""
    gaps, lengths = random.Random(seed), random.Random(seed + 1)
    t, requests = 0.0, []
    for i in range(num_requests):
        if math.isfinite(rate):
            t += gaps.expovariate(1.0) / rate
        prompt, output, lane = mix.draw(lengths)
        requests.append(_Request(t, prompt, output, lanes.index(lane) if lane in lanes else 99, i))
    return requests


class _Pool:
    def __init__(self, model: StepTimeModel, shape: ServerShape) -> None:
        self.model, self.shape = model, shape
        self.queues: dict[int, list[tuple[int, _Request]]] = {}  # lane -> (order, request) heap
        self.served = [0.0] * len(shape.lanes)  # recent dispatches per lane, decayed
        self.workers = [_Worker() for _ in range(shape.num_workers)]
        self.yield_ranks = {shape.lanes.index(x) for x in shape.yield_lanes if x in shape.lanes}
        lanes = shape.lanes
        self.reserved_rank = (
            lanes.index(shape.reserved_lane) if shape.reserved_lane in lanes else -1
        )
        self.num_steps = self.num_step_seqs = 0

    def enqueue(self, request: _Request) -> None:
        heapq.heappush(self.queues.setdefault(request.lane, []), (request.order, request))

    @property
    def has_waiting(self) -> bool:
        return any(self.queues.values())

    def _take(self) -> _Request | None:
        """The request the fair queue dispatches next (workers/fairqueue/dequeue.lua): the
        first of the highest backlogged lane, unless a lane below it is owed its minimum share
        (its share of recent dispatches a whole dispatch below `min_shares`), the lowest such
        lane first."""
        backlogged = sorted(rank for rank, queue in self.queues.items() if queue)
        if not backlogged:
            return None
        chosen, shares, total = backlogged[0], self.shape.min_shares, sum(self.served)
        for rank in reversed(backlogged[1:]):
            if rank < len(shares) and self.served[rank] + 1 <= shares[rank] * total:
                chosen = rank
                break
        return heapq.heappop(self.queues[chosen])[1]

    def _dispatched(self, request: _Request) -> None:
        decay = self.shape.share_decay
        self.served = [count * decay for count in self.served]
        if request.lane < len(self.served):
            self.served[request.lane] += 1

    def _room_for_yielding(self, worker: _Worker) -> list[int] | None:
        """As the engine's scheduler decides it (`_yield_room`): the yielding lanes give way
        while a sequence of another lane is in the worker's engine, running or pulled; one
        still in the fair queue is not."""
        if not self.yield_ranks:
            return None
        for request in (*worker.running, *worker.waiting):
            if request.lane not in self.yield_ranks:
                return [self.shape.bulk_beside]
        return None

    def _pull(self, worker: _Worker, now: float) -> None:
        """The worker's puller: requests from the fair queue into its engine while it has a
        slot for them (a pulled request holds its slot until it finishes, whether or not the
        engine has stepped it yet)."""
        while (request := self._take()) is not None:
            if len(worker.running) + len(worker.waiting) >= self._slots(worker, now, request):
                self.enqueue(request)  # the queue's order: the next request waits too
                return
            self._dispatched(request)
            worker.waiting.append(request)

    def _gives_way(self, request: _Request, room: list[int] | None) -> bool:
        if room is None or request.lane not in self.yield_ranks:
            return False
        if room[0] <= 0:
            return True
        room[0] -= 1
        return False

    def _slots(self, worker: _Worker, now: float, request: _Request) -> int:
        """Sequences the worker may hold for this request: its slots, less those the puller
        has not refilled yet and, for other lanes than the reserved one, the reserved ones."""
        worker.refills = [t for t in worker.refills if t > now]
        slots = self.shape.max_num_seqs - len(worker.refills)
        if request.lane != self.reserved_rank:
            slots -= self.shape.reserved_slots
        return slots

    def step_start(self, worker: _Worker, now: float) -> float | None:
        """Compose the worker's next step as the scheduler would; its seconds, or None when
        it has nothing to do."""
        self._pull(worker, now)
        budget, room = self.shape.max_num_batched_tokens, self._room_for_yielding(worker)
        worker.running.sort(key=lambda r: (r.lane, r.order))
        decodes_left = sum(1 for r in worker.running if not r.is_prefilling)
        plan: list[tuple[_Request, int]] = []
        for request in worker.running:
            if budget <= 0:
                break
            if self._gives_way(request, room):
                decodes_left -= 0 if request.is_prefilling else 1
                continue
            if request.is_prefilling:
                n = min(request.prompt - request.computed, budget - decodes_left)
                if n <= 0:
                    continue
            else:
                decodes_left -= 1
                n = 1
            plan.append((request, n))
            budget -= n
        worker.waiting.sort(key=lambda r: (r.lane, r.order))
        admitted = 0
        for request in worker.waiting:
            if budget <= 0 or len(worker.running) >= self.shape.max_num_seqs:
                break
            if room is not None and request.lane in self.yield_ranks and room[0] <= 0:
                continue  # a yielding lane's sequence beyond its places waits for a later step
            self._gives_way(request, room)
            n = min(request.prompt, budget)
            worker.running.append(request)
            plan.append((request, n))
            budget -= n
            admitted += 1
        if admitted:
            running = {id(r) for r in worker.running}
            worker.waiting = [r for r in worker.waiting if id(r) not in running]
        if not plan:
            return None
        prefill = decodes = context = 0
        for request, n in plan:
            if request.is_prefilling:
                prefill += n
            else:
                decodes += 1
                context += request.prompt + request.generated
        worker.plan, worker.is_busy = plan, True
        self.num_steps += 1
        self.num_step_seqs += len(plan)
        return self.model.seconds(prefill, decodes, context)

    def step_end(self, worker: _Worker, now: float) -> list[_Request]:
        """Apply the step's work; the requests it finished."""
        finished = []
        worker.refills = [t for t in worker.refills if t > now]
        in_flight = len(worker.running) + len(worker.waiting) + len(worker.refills)
        was_full = in_flight >= self.shape.max_num_seqs - self.shape.reserved_slots
        for request, n in worker.plan:
            if request.is_prefilling:
                request.computed += n
                if request.computed == request.prompt:
                    request.generated, request.first_at = 1, now
            else:
                request.generated += 1
            if not request.is_prefilling and request.generated >= request.output:
                request.done_at = now
                finished.append(request)
        if finished:
            done = {id(r) for r in finished}
            worker.running = [r for r in worker.running if id(r) not in done]
            if was_full and self.shape.refill_s:
                worker.refills += [now + self.shape.refill_s] * len(finished)
        worker.plan, worker.is_busy = [], False
        return finished


def simulate(
    model: StepTimeModel,
    shape: ServerShape,
    mix: Mix,
    rate: float,
    *,
    num_requests: int = 2000,
    seed: int = 0,
    warmup: float = 0.1,
) -> Prediction:
    """Serve ``num_requests`` Poisson arrivals at ``rate``/s (``math.inf``: all at t=0) and
    report the latencies and throughput of those after the first ``warmup`` fraction."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    requests = arrivals_draw(mix, rate, num_requests, seed, shape.lanes)
    pool = _Pool(model, shape)
    ends: list[tuple[float, int, int]] = []  # (time, tie-break, worker index)
    done: list[_Request] = []
    i, tick = 0, 0

    def kick(now: float) -> None:
        nonlocal tick
        for index, worker in enumerate(pool.workers):
            if worker.is_busy:
                continue
            if (seconds := pool.step_start(worker, now)) is not None:
                tick += 1
                heapq.heappush(ends, (now + seconds, tick, index))
            elif pool.has_waiting and worker.refills:  # wake when a slot is refilled
                worker.is_busy = True
                tick += 1
                heapq.heappush(ends, (min(worker.refills), tick, index))

    while i < len(requests) or ends:
        if i < len(requests) and (not ends or requests[i].arrival <= ends[0][0]):
            now = requests[i].arrival
            while i < len(requests) and requests[i].arrival <= now:
                pool.enqueue(requests[i])
                i += 1
            kick(now)
            continue
        now, _, index = heapq.heappop(ends)
        done.extend(pool.step_end(pool.workers[index], now))
        kick(now)
    return _prediction(requests, done, pool, rate, shape, warmup)


def _prediction(
    requests: list[_Request],
    done: list[_Request],
    pool: _Pool,
    rate: float,
    shape: ServerShape,
    warmup: float,
) -> Prediction:
    skip, overhead = int(len(requests) * warmup), shape.overhead_s
    measured = requests[skip:]
    by_lane: dict[str, list[float]] = {}
    for r in measured:
        name = shape.lanes[r.lane] if r.lane < len(shape.lanes) else "other"
        by_lane.setdefault(name, []).append(r.first_at - r.arrival + overhead)
    ttft = sorted(r.first_at - r.arrival + overhead for r in measured)
    e2e = sorted(r.done_at - r.arrival + overhead + shape.tail_s for r in measured)
    if math.isfinite(rate):
        start, end = measured[0].arrival, requests[-1].arrival
    else:  # a backlog: the middle of the completions, before the last ones drain alone
        by_end = sorted(r.done_at for r in done)
        start, end = by_end[len(by_end) // 10], by_end[(len(by_end) * 9) // 10]
    window = [r for r in done if start <= r.done_at <= end]
    span = max(end - start, 1e-9)
    throughput = len(window) / span
    return Prediction(
        rate=rate,
        num_requests=len(measured),
        ttft_p50=percentile(ttft, 0.5),
        ttft_p95=percentile(ttft, 0.95),
        e2e_p50=percentile(e2e, 0.5),
        e2e_p95=percentile(e2e, 0.95),
        e2e_mean=sum(e2e) / len(e2e),
        itl_p50=percentile(
            sorted((r.done_at - r.first_at) / (r.output - 1) for r in measured if r.output > 1)
            or [0.0],
            0.5,
        ),
        throughput_rps=throughput,
        output_tok_s=sum(r.output for r in window) / span,
        batch_seqs_mean=pool.num_step_seqs / max(pool.num_steps, 1),
        is_saturated=math.isfinite(rate) and throughput < 0.95 * rate,
        ttft_p95_by_lane={k: percentile(sorted(v), 0.95) for k, v in sorted(by_lane.items())},
    )


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (what the benches report)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
