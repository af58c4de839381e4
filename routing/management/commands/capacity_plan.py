"""`python manage.py capacity_plan --model tiny --rate 5 --prompt-tokens 16-512
--output-tokens 16-128 --p95-ms 4000 [--calibrate] [--json]`

Fits the model's step times (from the steps the live workers recorded, or with --calibrate
from a run of the real engine in this process), simulates the fair queue and the engine's
continuous batching on the request mix, and prints the p50/p95 time to first token and
latency and the throughput at --rate on --workers workers, one worker's saturation rate and
knee (the highest rate meeting the targets), and the workers the rate needs. The plan is
kept as the model's CapacityFit, which the ops dashboard reads (--no-save: not kept).
"""

import json
import math

from django.core.management.base import CommandError

from routing.runtimes import RuntimeCommand
from routing.services import capacity
from tenants.errors import InvalidRequest
from workers.engine.planner import Targets


class Command(RuntimeCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True, help="a registered model, or a preset")
        parser.add_argument("--rate", type=float, required=True, help="arrivals, requests/s")
        parser.add_argument("--prompt-tokens", required=True, help="N or LOW-HIGH (uniform)")
        parser.add_argument("--output-tokens", required=True, help="N or LOW-HIGH (uniform)")
        parser.add_argument("--bulk-fraction", type=float, default=0.0, help="share on bulk")
        parser.add_argument("--p95-ms", type=float, default=None, help="p95 latency target")
        parser.add_argument("--ttft-p95-ms", type=float, default=None, help="p95 TTFT target")
        parser.add_argument(
            "--workers", type=int, default=0, help="workers to predict for (0: those live, or 1)"
        )
        parser.add_argument(
            "--overhead-ms", type=float, default=0.0, help="fixed latency outside the engine"
        )
        parser.add_argument("--calibrate", action="store_true", help="time the engine here")
        parser.add_argument("--quick", action="store_true", help="a small calibration grid")
        parser.add_argument("--requests", type=int, default=2000, help="simulated arrivals")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--json", action="store_true", help="one JSON object")
        parser.add_argument("--no-save", action="store_true", help="do not keep the plan")

    def handle(self, *args, **o):
        try:
            result = self._plan(o)
        except InvalidRequest as exc:
            raise CommandError(exc.message) from None
        if o["json"]:
            self.stdout.write(json.dumps(_as_dict(result)))
        else:
            self._print(result)

    def _plan(self, o) -> capacity.PlanResult:
        info = capacity.model_info_resolve(name=o["model"])
        mix = capacity.mix_make(
            prompt_tokens=o["prompt_tokens"],
            output_tokens=o["output_tokens"],
            bulk_fraction=o["bulk_fraction"],
        )
        targets = Targets(
            e2e_p95=o["p95_ms"] / 1000 if o["p95_ms"] else None,
            ttft_p95=o["ttft_p95_ms"] / 1000 if o["ttft_p95_ms"] else None,
        )
        workers = o["workers"]
        if o["calibrate"]:
            samples = capacity.step_samples_calibrate(info=info, quick=o["quick"])
            source = "calibrate"
        else:
            runtime = self.runtime
            samples = capacity.step_samples_from_workers(runtime=runtime, model=info.name)
            source = "workers"
            workers = workers or capacity.workers_hosting(runtime=runtime, model=info.name)
        return capacity.capacity_plan(
            info=info,
            samples=samples,
            source=source,
            mix=mix,
            rate=o["rate"],
            targets=targets,
            num_workers=max(workers, 1),
            overhead_s=o["overhead_ms"] / 1000,
            num_requests=o["requests"],
            seed=o["seed"],
            is_saved=not o["no_save"],
        )

    def _print(self, result: capacity.PlanResult) -> None:
        m, plan, p = result.step_model, result.plan, result.plan.prediction
        w = self.stdout.write
        w(f"capacity plan for {result.model} ({result.source}, {m.num_samples} steps)")
        w(
            f"  step time = {m.base * 1e3:.3f} ms + {m.per_prefill_token * 1e6:.2f} us/prefill "
            f"token + {m.per_decode_seq * 1e6:.2f} us/decoding seq + "
            f"{m.per_context_token * 1e9:.2f} ns/context token "
            f"(median error {m.median_rel_error:.0%}, p95 {m.p95_rel_error:.0%})"
        )
        w(
            f"  engine: max_num_seqs {result.shape.max_num_seqs}, token budget "
            f"{result.shape.max_num_batched_tokens}, {result.shape.num_workers} worker(s); a "
            f"full worker's freed slot empty {result.shape.refill_s * 1e3:.1f} ms (the ledger's "
            "last 15 minutes)"
        )
        w(
            f"  at {plan.rate:g} req/s: TTFT p50 {p.ttft_p50 * 1e3:.0f} ms, p95 "
            f"{p.ttft_p95 * 1e3:.0f} ms; latency p50 {p.e2e_p50 * 1e3:.0f} ms, p95 "
            f"{p.e2e_p95 * 1e3:.0f} ms; throughput {p.throughput_rps:.2f} req/s, "
            f"{p.output_tok_s:.0f} output tok/s{' (saturated)' if p.is_saturated else ''}"
        )
        w(
            f"  one worker: saturates at {plan.saturation_rps:.2f} req/s; meets the targets "
            f"up to {plan.capacity_rps:.2f} req/s"
        )
        needed = plan.workers_needed
        w(f"  workers needed for {plan.rate:g} req/s: {needed if needed else 'none suffices'}")


def _as_dict(result: capacity.PlanResult) -> dict:
    plan = result.plan
    prediction = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in plan.prediction.to_dict().items()
    }
    return {
        "model": result.model,
        "source": result.source,
        "step_model": result.step_model.to_dict(),
        "max_num_seqs": result.shape.max_num_seqs,
        "max_num_batched_tokens": result.shape.max_num_batched_tokens,
        "workers": result.shape.num_workers,
        "refill_s": result.shape.refill_s,
        "rate": plan.rate,
        "targets": {"e2e_p95": plan.targets.e2e_p95, "ttft_p95": plan.targets.ttft_p95},
        "prediction": prediction,
        "saturation_rps_per_worker": plan.saturation_rps,
        "capacity_rps_per_worker": plan.capacity_rps,
        "workers_needed": plan.workers_needed,
    }
