"""The benchmark command: workloads, systems, report. See ``run``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workers.engine.bench.ours import engine_run
from workers.engine.bench.report import report_print
from workers.engine.bench.results import RunResult
from workers.engine.bench.workload import mixed_workload, shared_prefix_workload
from workers.engine.presets import ensure_preset

BASELINES = ("one_at_a_time", "static_8", "static_16", "continuous")
SECTIONS = ("mixed", "spec", "quant", "guide")
FULL = {
    "num_requests": 64,
    "prompt_range": (16, 512),
    "output_range": (16, 256),
    "shared_requests": 64,
    "shared_output": 32,
}
QUICK = {
    "num_requests": 16,
    "prompt_range": (16, 128),
    "output_range": (16, 64),
    "shared_requests": 32,
    "shared_output": 8,
}
SYSTEM_PROMPT_TOKENS = 256
USER_TURN_RANGE = (16, 48)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m workers.engine.bench", description=__doc__
    )
    p.add_argument(
        "--quick", action="store_true", help="small workload, finishes in under a minute"
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (weights always use seed 0)")
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests in the mixed workload (default 64, quick 16)",
    )
    p.add_argument(
        "--shared-requests",
        type=int,
        default=None,
        help="requests in the shared-prefix workload (default 64, quick 32; fewer for a big"
        " preset)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    p.add_argument("--preset", "--model", default="small", help="model preset (default small)")
    p.add_argument(
        "--models-dir", type=Path, default=Path("var/models"), help="where presets are generated"
    )
    p.add_argument(
        "--skip", default="", help=f"comma-separated baselines to leave out: {','.join(BASELINES)}"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every system this many times, interleaved; keep the fastest",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=1024,
        help="our step token budget (HF CB gets the same)",
    )
    p.add_argument(
        "--sections",
        default=",".join(s for s in SECTIONS if s != "guide"),
        help=f"comma-separated: {', '.join(SECTIONS)} (mixed: against Hugging Face;"
        " spec: speculative decoding on the trained pair, trained first if missing;"
        " quant: int8/int4;"
        " guide: constrained decoding's cost at batch 8, not run by default)",
    )
    p.add_argument(
        "--sweep-batches",
        default="1,2,4,8,16",
        help="spec: the batch sizes of the speculation sweep (comma-separated)",
    )
    p.add_argument(
        "--sweep-repeat",
        type=int,
        default=3,
        help="spec: repeats of the sweep, modes interleaved within each (0: no sweep)",
    )
    p.add_argument(
        "--sweep-workloads",
        default="edit",
        help="spec: the sweep's workloads, comma-separated: edit, code",
    )
    p.add_argument(
        "--sweep-only",
        action="store_true",
        help="spec: leave out the batch 1 and 8 table, run only the sweep",
    )
    p.add_argument(
        "--group-size", type=int, default=128, choices=[32, 64, 128], help="int4 group size (quant)"
    )
    p.add_argument(
        "--no-prepack",
        action="store_true",
        help="our engine without oneDNN weight prepacking (torch's default linear path),"
        " to compare",
    )
    return p.parse_args(argv)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run every section's systems on the same workloads, print the report and
    one JSON line, return the figures."""
    args = parse(argv)
    torch.set_num_threads(args.threads)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if set(sections) - set(SECTIONS):
        raise SystemExit(f"--sections takes {', '.join(SECTIONS)}")
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    result: dict[str, Any] = {
        "benchmark": "engine",
        "quick": args.quick,
        "seed": args.seed,
        "threads": args.threads,
        "repeat": args.repeat,
        "sections": sections,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
    if "mixed" in sections:
        result.update(_mixed(args))
    if "spec" in sections or "quant" in sections:
        result.update(_second_half(args, sections))
    if "guide" in sections:
        from workers.engine.bench import guide

        result["guide"] = guide.run(
            [
                "--preset",
                args.preset,
                "--models-dir",
                str(args.models_dir),
                "--requests",
                "8",
                "--repeat",
                str(max(args.repeat, 3)),
                "--threads",
                str(args.threads),
            ]
        )
    result["wall_s"] = round(time.perf_counter() - started, 1)
    # 1-minute load average before and after: other processes on the box skew every figure.
    result["load_avg"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(
        f"wall time {result['wall_s']} s; load average {result['load_avg'][0]} before,"
        f" {result['load_avg'][1]} after"
    )
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, separators=(",", ":")))
    sys.stdout.flush()
    return result


def _second_half(args: argparse.Namespace, sections: list[str]) -> dict[str, Any]:
    """Speculation and quantization, on the trained pair (trained here first if missing)."""
    from workers.engine.bench.quant import quant_print, quant_section
    from workers.engine.bench.spec import spec_print, spec_section
    from workers.engine.training import corpus_load, train_pair

    pair = train_pair(
        args.models_dir, log=lambda line: print(f"[train] {line}", file=sys.stderr, flush=True)
    )
    target, draft = Path(pair["small"]["path"]), Path(pair["draft"]["path"])
    corpus = corpus_load()
    out: dict[str, Any] = {
        "trained_pair": {p: {k: v for k, v in m.items() if k != "recipe"} for p, m in pair.items()}
    }
    if "spec" in sections:
        out["speculation"] = spec_section(
            target,
            draft,
            corpus.heldout_files,
            quick=args.quick,
            repeat=args.repeat,
            sweep_batches=tuple(int(b) for b in args.sweep_batches.split(",") if b.strip()),
            sweep_repeat=args.sweep_repeat,
            sweep_workloads=tuple(w.strip() for w in args.sweep_workloads.split(",") if w.strip()),
            table=not args.sweep_only,
        )
        spec_print(out["speculation"])
    if "quant" in sections:
        windows = corpus.windows(
            "heldout", num=8 if args.quick else 24, length=256, seed=7
        ).tolist()
        speed_models = [target] + (
            [] if args.quick else [ensure_preset("medium", args.models_dir, seed=0)]
        )
        out["quantization"] = quant_section(
            speed_models,
            target,
            windows,
            group_size=args.group_size,
            repeat=args.repeat,
            quick=args.quick,
        )
        quant_print(out["quantization"])
    return out


def _mixed(args: argparse.Namespace) -> dict[str, Any]:
    """Our engine against Hugging Face on the mixed and shared-prefix workloads."""
    shape = dict(QUICK if args.quick else FULL)
    if args.num_requests is not None:
        shape["num_requests"] = args.num_requests
    if args.shared_requests is not None:
        shape["shared_requests"] = max(args.shared_requests, 1)
    requests = mixed_workload(
        seed=args.seed,
        num_requests=shape["num_requests"],
        prompt_range=shape["prompt_range"],
        output_range=shape["output_range"],
    )
    shared = shared_prefix_workload(
        seed=args.seed,
        num_requests=shape["shared_requests"],
        system_tokens=SYSTEM_PROMPT_TOKENS,
        turn_range=USER_TURN_RANGE,
        num_output_tokens=shape["shared_output"],
    )
    peak = matmul_peak_gflops(threads=args.threads)
    best = _run_systems(_systems(args, shape, requests, shared), args.repeat)
    ours, cached, uncached = (
        best.pop("ours"),
        best.pop("prefix_cache_on"),
        best.pop("prefix_cache_off"),
    )
    result = {
        "preset": args.preset,
        "workload": {
            "num_requests": len(requests),
            "prompt_tokens": sum(len(r.prompt) for r in requests),
            "output_tokens": sum(r.num_output_tokens for r in requests),
            "prompt_range": shape["prompt_range"],
            "output_range": shape["output_range"],
        },
        "ours": ours.summary(),
        "baselines": {name: r.summary() for name, r in best.items()},
        "ratios": _ratios(ours, best),
        "matmul": _matmul_shares(args, peak, requests, {"ours": ours, **best}),
        "shared_prefix": _shared_summary(cached, uncached, shared),
        "kv_waste": ours.extra["kv_waste"],
    }
    report_print(
        {
            **result,
            "threads": args.threads,
            "seed": args.seed,
            "quick": args.quick,
            "repeat": args.repeat,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        }
    )
    return result


def _systems(
    args: argparse.Namespace, shape: dict, requests, shared
) -> dict[str, Callable[[], RunResult]]:
    """Every system, as a callable; the model directory is ensured again before each run
    (var/ may be cleaned meanwhile; regenerating is deterministic)."""
    from workers.engine.bench import hf

    def model_dir() -> Path:
        return ensure_preset(args.preset, args.models_dir, seed=0)

    config = {
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": max(64, shape["num_requests"]),
        "is_weight_prepacking_enabled": not args.no_prepack,
    }
    hf_model: list = []

    def hf_run(fn: Callable, *fn_args: Any, **fn_kwargs: Any) -> Callable[[], RunResult]:
        def go() -> RunResult:
            if not hf_model:
                hf_model.append(hf.hf_model_load(model_dir()))
            return fn(hf_model[0], *fn_args, **fn_kwargs)

        return go

    systems: dict[str, Callable[[], RunResult]] = {
        "ours": lambda: engine_run(model_dir(), requests, **config),
        "one_at_a_time": hf_run(hf.hf_one_at_a_time, requests),
        "static_8": hf_run(hf.hf_static_batches, requests, 8),
        "static_16": hf_run(hf.hf_static_batches, requests, 16),
        "continuous": hf_run(
            hf.hf_continuous_batching,
            requests,
            max_batch_tokens=args.max_num_batched_tokens,
            num_blocks=_cb_blocks(requests),
        ),
        "prefix_cache_on": lambda: engine_run(
            model_dir(), shared, name="ours_prefix_cache_on", **config
        ),
        "prefix_cache_off": lambda: engine_run(
            model_dir(),
            shared,
            name="ours_prefix_cache_off",
            **{**config, "is_prefix_caching_enabled": False},
        ),
    }
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(BASELINES):
        raise SystemExit(f"--skip takes baselines only: {', '.join(BASELINES)}")
    return {name: fn for name, fn in systems.items() if name not in skip}


def _run_systems(systems: dict[str, Callable[[], RunResult]], repeat: int) -> dict[str, RunResult]:
    """Run every system ``repeat`` times, interleaved, keeping each one's fastest run."""
    best: dict[str, RunResult] = {}
    for _ in range(repeat):
        for name, fn in systems.items():
            try:
                result = fn()
            except Exception as exc:  # a baseline that cannot run here is reported, not fatal
                if name not in BASELINES:
                    raise
                result = RunResult(
                    f"hf_{name}", 0.0, 0, [], note=f"did not run: {type(exc).__name__}: {exc}"
                )
            _progress(result)
            if name not in best or (
                result.makespan_s and result.makespan_s < best[name].makespan_s
            ):
                best[name] = result
    return best


def _progress(result: RunResult) -> RunResult:
    """One line per finished run on stderr, so a long run shows where it is."""
    print(
        f"[bench] {result.name}: {result.output_tok_s:.1f} tok/s, makespan {result.makespan_s:.1f}"
        " s",
        file=sys.stderr,
        flush=True,
    )
    return result


def _cb_blocks(requests) -> int:
    """Enough 256-token pages for every request at once, like our pool: no preemption either
    side."""
    return sum(-(-(len(r.prompt) + r.num_output_tokens) // 256) for r in requests) + 8


def matmul_peak_gflops(*, threads: int, size: int = 1024, seconds: float = 1.0) -> float:
    """This machine's fp32 matrix-multiply rate with the benchmark's threads: square products
    of `size`, the best of the rounds in about `seconds` (after a warm-up), in GFLOP/s."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        torch.mm(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - started) / 1e9)
    return round(best, 1)


def _matmul_shares(
    args: argparse.Namespace, peak: float, requests, results: dict[str, RunResult]
) -> dict[str, Any]:
    """Each system's matrix-multiply rate on the mixed workload (every prompt and output token
    once through the model's projections and LM head: 2 FLOPs per weight), and its share of the
    machine's peak measured in the same run. Attention's own products and recomputed tokens
    are left out, so this is a floor of what each did."""
    from workers.engine.presets import preset_config, preset_matmul_params

    params = preset_matmul_params(preset_config(args.preset))
    tokens = sum(len(r.prompt) + r.num_output_tokens for r in requests)
    shares: dict[str, Any] = {"peak_gflops": peak, "matmul_params": params, "tokens": tokens}
    for name, result in results.items():
        if result.makespan_s:
            rate = 2 * params * tokens / result.makespan_s / 1e9
            shares[name] = {"gflops": round(rate, 1), "peak_fraction": round(rate / peak, 3)}
    return shares


def _ratios(ours: RunResult, baselines: dict[str, RunResult]) -> dict[str, dict[str, float | None]]:
    ratios = {}
    for name, base in baselines.items():
        if not base.makespan_s:
            ratios[name] = {
                "throughput": None,
                "cpu_time": None,
                "ttft_p50": None,
                "ttft_p99": None,
            }
            continue
        ratios[name] = {
            "throughput": round(ours.output_tok_s / base.output_tok_s, 2),
            # The same work in CPU seconds: less sensitive to other processes on a shared box.
            "cpu_time": round(base.cpu_s / ours.cpu_s, 2) if ours.cpu_s else None,
            "ttft_p50": round(base.ttft_p(50) / ours.ttft_p(50), 2),
            "ttft_p99": round(base.ttft_p(99) / ours.ttft_p(99), 2),
        }
    return ratios


def _shared_summary(cached: RunResult, uncached: RunResult, shared) -> dict[str, Any]:
    return {
        "num_requests": len(shared),
        "system_prompt_tokens": SYSTEM_PROMPT_TOKENS,
        "user_turn_range": USER_TURN_RANGE,
        "prefix_hit_rate": cached.extra["prefix_hit_rate"],
        "cache_on": cached.summary(),
        "cache_off": uncached.summary(),
        "ttft_p50_speedup": round(uncached.ttft_p(50) / cached.ttft_p(50), 2),
        "ttft_p99_speedup": round(uncached.ttft_p(99) / cached.ttft_p(99), 2),
        "throughput_speedup": round(cached.output_tok_s / uncached.output_tok_s, 2),
    }
