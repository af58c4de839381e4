"""The capacity planner's workflow (issue 34): step samples (a calibration run on the real
engine, or the steps the workers recorded), the step-time fit, the plan from the queue
simulation (workers/engine/planner), and the model's CapacityFit row that the ops dashboard
reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from routing.models import CapacityFit
from tenants.errors import InvalidRequest
from tenants.models import Lane, UsageRecord
from workers.engine.planner import (
    Mix,
    Plan,
    RequestClass,
    ServerShape,
    StepSample,
    StepTimeModel,
    Targets,
    plan_make,
    step_model_fit,
)
from workers.engine.planner.calibrate import QUICK, Grid, calibrate
from workers.engine.planner.refill import Timeline, refill_seconds
from workers.engine.presets import PRESETS
from workers.serving.catalog import ModelInfo, model_engine_config, model_get
from workers.serving.runtime import Runtime


@dataclass(frozen=True, slots=True)
class PlanResult:
    model: str
    source: str
    step_model: StepTimeModel
    shape: ServerShape
    mix: Mix
    plan: Plan


def token_range_parse(text: str, *, param: str) -> tuple[int, int]:
    """ "128" (fixed) or "16-512" (uniform, inclusive)."""
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise InvalidRequest(f"{param} takes N or LOW-HIGH tokens", param=param) from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise InvalidRequest(f"{param} needs 1 <= LOW <= HIGH", param=param)
    return bounds


def mix_make(*, prompt_tokens: str, output_tokens: str, bulk_fraction: float = 0.0) -> Mix:
    """One class of requests on the standard lane, and a share of the same on the bulk lane."""
    if not 0.0 <= bulk_fraction < 1.0:
        raise InvalidRequest("bulk fraction must be in [0, 1)", param="bulk_fraction")
    prompt = token_range_parse(prompt_tokens, param="prompt_tokens")
    output = token_range_parse(output_tokens, param="output_tokens")
    classes = [RequestClass(prompt, output, Lane.STANDARD.value, 1.0 - bulk_fraction)]
    if bulk_fraction:
        classes.append(RequestClass(prompt, output, Lane.BULK.value, bulk_fraction))
    return Mix(tuple(classes))


def model_info_resolve(*, name: str) -> ModelInfo:
    """The registered model, or a preset of that name (the planner works without a registry)."""
    info = model_get(name=name)
    if info is None and name in PRESETS:
        info = ModelInfo(name=name, source=f"preset:{name}")
    if info is None:
        raise InvalidRequest(f"no model {name!r} is registered and enabled", param="model")
    if info.runtime != "engine":
        raise InvalidRequest("the planner models our engine, not vLLM", param="model")
    return info


def engine_shape(*, info: ModelInfo, num_workers: int, overhead_s: float = 0.0) -> ServerShape:
    """The pool as the workers run it: the engine config this deployment starts the model
    with (its max_num_seqs, token budget and yielding lanes) and the workers' pullers (their
    concurrency, the slots kept for realtime requests); the refill of a full worker's freed
    slot is measured apart (`refill_from_ledger`)."""
    config = model_engine_config(info)
    return ServerShape(
        num_workers=num_workers,
        max_num_seqs=min(config.max_num_seqs, settings.FAIRLANE_WORKER_CONCURRENCY),
        reserved_slots=settings.FAIRLANE_REALTIME_RESERVED_SLOTS,
        reserved_lane=Lane.REALTIME.value,
        max_num_batched_tokens=config.max_num_batched_tokens,
        yield_lanes=config.yield_lanes,
        bulk_beside=config.yield_max_seqs,
        lanes=tuple(Lane.values),
        min_shares=lane_min_shares(),
        overhead_s=overhead_s,
    )


def lane_min_shares() -> tuple[float, ...]:
    """Each lane's minimum share of the fair queue's dispatches (in `Lane` order), as the
    workers' queue is configured (workers/transport.py)."""
    shares = {
        Lane.STANDARD.value: settings.FAIRLANE_MIN_SHARE_STANDARD,
        Lane.BULK.value: settings.FAIRLANE_MIN_SHARE_BULK,
    }
    return tuple(shares.get(lane, 0.0) for lane in Lane.values)


def step_samples_calibrate(*, info: ModelInfo, quick: bool = False) -> list[StepSample]:
    """Step the model on the real engine, in this process, over the calibration grid."""
    config = model_engine_config(info)
    return calibrate(
        config.model,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_threads=config.num_threads,
        grid=QUICK if quick else Grid(),
    )


def step_samples_from_workers(*, runtime: Runtime, model: str) -> list[StepSample]:
    """The steps every live worker recorded for the model (its engines' last steps)."""
    return [
        StepSample.from_row(row)
        for worker in runtime.pool.worker_states()
        for row in worker.engines.get(model, {}).get("step_samples", [])
    ]


def refill_from_ledger(
    *, model: str, full: int, since: datetime | None = None, until: datetime | None = None
) -> float:
    """How long a full worker's freed slot stayed empty (refill.py), from the timelines of the
    model's requests the workers answered since `since` (the last 15 minutes); 0 when too few
    requests ended on a full worker with another waiting."""
    rows = UsageRecord.objects.filter(
        model=model,
        created_at__gte=since or timezone.now() - timedelta(minutes=15),
        backend__startswith="worker:",
    )
    if until is not None:
        rows = rows.filter(created_at__lte=until)
    timelines = [
        Timeline(t["worker"], t["queued"], t["taken"], t["last_token"], t.get("submitted"))
        for t in rows.order_by().values_list("timeline", flat=True).iterator()
        if all(k in t for k in ("worker", "queued", "taken", "last_token"))
    ]
    return refill_seconds(timelines, full=full) or 0.0


def workers_hosting(*, runtime: Runtime, model: str) -> int:
    return sum(1 for w in runtime.pool.worker_states() if model in w.engines)


def capacity_plan(
    *,
    info: ModelInfo,
    samples: list[StepSample],
    source: str,
    mix: Mix,
    rate: float,
    targets: Targets,
    num_workers: int = 1,
    overhead_s: float = 0.0,
    num_requests: int = 2000,
    seed: int = 0,
    is_saved: bool = True,
) -> PlanResult:
    """Fit the step times, plan, and keep the plan as the model's CapacityFit."""
    if rate <= 0:
        raise InvalidRequest("rate must be positive (requests per second)", param="rate")
    if len(samples) < 4:
        raise InvalidRequest(
            f"{len(samples)} step samples for {info.name}: run with --calibrate, or let a "
            "worker serve the model for a while",
            param="model",
        )
    step_model = step_model_fit(samples)
    shape = engine_shape(info=info, num_workers=num_workers, overhead_s=overhead_s)
    full = shape.max_num_seqs - shape.reserved_slots
    shape = replace(shape, refill_s=refill_from_ledger(model=info.name, full=full))
    plan = plan_make(step_model, shape, mix, rate, targets, num_requests=num_requests, seed=seed)
    result = PlanResult(info.name, source, step_model, shape, mix, plan)
    if is_saved:
        capacity_fit_save(result=result)
    return result


def capacity_fit_save(*, result: PlanResult) -> CapacityFit:
    plan = result.plan
    fit, _ = CapacityFit.objects.update_or_create(
        model=result.model,
        defaults={
            "source": result.source,
            "step_model": result.step_model.to_dict(),
            "shape": asdict(result.shape),
            "mix": [asdict(c) for c in result.mix.classes],
            "targets": asdict(plan.targets),
            "rate": plan.rate,
            "capacity_rps": plan.capacity_rps,
            "saturation_rps": plan.saturation_rps,
            "workers_needed": plan.workers_needed,
            "prediction": plan.prediction.to_dict(),
        },
    )
    return fit
