"""What a plan asks of the simulation: the pool's saturation throughput, the knee (the
highest arrival rate whose p95 latencies meet the targets), and the workers a rate needs."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workers.engine.planner.simulate import Mix, Prediction, ServerShape, simulate
from workers.engine.planner.stepmodel import StepTimeModel

MAX_WORKERS = 1000


@dataclass(frozen=True, slots=True)
class Targets:
    """p95 latency targets in seconds (None: no target on that one)."""

    e2e_p95: float | None = None
    ttft_p95: float | None = None

    def met(self, prediction: Prediction, *, steady: bool = True) -> bool:
        """Whether ``prediction`` meets the targets; ``steady=False`` (a run of a few hundred
        arrivals, as a benchmark's level sends) judges its p95s alone: over so few arrivals
        the completions can fall 5 % short of the nominal rate by chance."""
        if steady and prediction.is_saturated:
            return False
        if self.e2e_p95 is not None and prediction.e2e_p95 > self.e2e_p95:
            return False
        return self.ttft_p95 is None or prediction.ttft_p95 <= self.ttft_p95


@dataclass(frozen=True, slots=True)
class Plan:
    rate: float
    targets: Targets
    prediction: Prediction  # at `rate` on the shape's workers
    saturation_rps: float  # per worker: completions/s with a standing backlog
    capacity_rps: float  # per worker: the knee, the highest rate meeting the targets
    workers_needed: int | None  # for `rate` (None: one worker's unloaded latency misses them)


def saturation_rate(
    model: StepTimeModel, shape: ServerShape, mix: Mix, *, num_requests: int, seed: int
) -> float:
    """Completions/s of the pool with every request queued at t=0."""
    backlog = simulate(model, shape, mix, math.inf, num_requests=num_requests, seed=seed)
    return backlog.throughput_rps


def capacity_search(
    model: StepTimeModel,
    shape: ServerShape,
    mix: Mix,
    targets: Targets,
    *,
    num_requests: int = 2000,
    seed: int = 0,
    rel_tol: float = 0.01,
    steady: bool = True,
) -> float:
    """The knee: the highest rate (requests/s) at which the pool meets the targets, by
    bisection below the saturation rate; 0 when even a light load misses them. Without a
    target the knee is the saturation rate itself. ``steady=False``: the knee of a run of
    ``num_requests`` arrivals by its p95s alone (``Targets.met``)."""
    top = saturation_rate(model, shape, mix, num_requests=num_requests, seed=seed)
    if targets.e2e_p95 is None and targets.ttft_p95 is None:
        return top
    low, high = 0.0, top

    def meets(rate: float) -> bool:
        prediction = simulate(model, shape, mix, rate, num_requests=num_requests, seed=seed)
        return targets.met(prediction, steady=steady)

    if not meets(top * 0.02):
        return 0.0
    low = top * 0.02
    while high - low > rel_tol * high:
        middle = (low + high) / 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def workers_needed(
    model: StepTimeModel,
    shape: ServerShape,
    mix: Mix,
    rate: float,
    targets: Targets,
    *,
    per_worker_rps: float,
    num_requests: int = 2000,
    seed: int = 0,
) -> int | None:
    """The fewest workers (sharing one queue) that serve ``rate`` within the targets: from
    ``rate / per_worker_rps`` rounded down, one more at a time. None if one worker's knee is 0."""
    if per_worker_rps <= 0:
        return None
    count = max(1, math.floor(rate / per_worker_rps))
    while count <= MAX_WORKERS:
        pool = replace(shape, num_workers=count)
        scaled = max(num_requests, 200 * count)  # enough arrivals to load every worker
        if targets.met(simulate(model, pool, mix, rate, num_requests=scaled, seed=seed)):
            return count
        count += 1
    return None


def plan_make(
    model: StepTimeModel,
    shape: ServerShape,
    mix: Mix,
    rate: float,
    targets: Targets,
    *,
    num_requests: int = 2000,
    seed: int = 0,
) -> Plan:
    """The prediction at ``rate`` on ``shape``, one worker's saturation rate and knee, and
    the workers ``rate`` needs."""
    one = replace(shape, num_workers=1)
    saturation = saturation_rate(model, one, mix, num_requests=num_requests, seed=seed)
    knee = capacity_search(model, one, mix, targets, num_requests=num_requests, seed=seed)
    needed = workers_needed(
        model, shape, mix, rate, targets, per_worker_rps=knee, num_requests=num_requests, seed=seed
    )
    prediction = simulate(model, shape, mix, rate, num_requests=num_requests, seed=seed)
    return Plan(rate, targets, prediction, saturation, knee, needed)
