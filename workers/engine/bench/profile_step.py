"""Where one decode step's time goes: `python -m workers.engine.bench.profile_step --preset
qwen2-0.5b --batch 8`. An engine on the preset prefills `--batch` requests of `--prompt`
tokens, then torch's profiler records `--steps` decode steps; the operators' own CPU time is
grouped into the projections, attention, sampling and the other (mostly elementwise) ops, and
the rest of each step's (profiled) wall time is Python and everything outside torch's operators,
the profiler's own cost per operator included; the same steps' time without the profiler comes
first."""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.presets import ensure_preset

GROUPS = (
    ("projections", ("linear", "addmm", "aten::mm", "aten::bmm", "matmul", "mkldnn")),
    ("attention", ("attention", "sdpa", "softmax", "flash")),
    ("sampling", ("argmax", "multinomial", "topk", "sort", "log_softmax")),
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m workers.engine.bench.profile_step"
    )
    p.add_argument("--preset", "--model", default="small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens of each request")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models-dir", type=Path, default=Path("var/models"))
    return p.parse_args(argv)


def run(argv: list[str] | None = None) -> dict[str, float]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model=str(ensure_preset(args.preset, args.models_dir))))
    greedy = {"temperature": 0.0, "ignore_eos": True}
    engine.generate([[5] * 40], SamplingParams(max_tokens=4, **greedy))  # one-time costs
    prefill_steps = -(-args.batch * args.prompt // engine.config.max_num_batched_tokens)
    for i in range(args.batch):
        engine.add_request(
            [7 + i] * args.prompt,
            SamplingParams(max_tokens=2 * args.steps + 8 + prefill_steps, **greedy),
        )
    for _ in range(prefill_steps + 3):  # the prefill and the first decodes
        engine.step()
    started = time.perf_counter()
    for _ in range(args.steps):  # unprofiled: the profiler's own cost per op is not in it
        engine.step()
    bare_ms = (time.perf_counter() - started) / args.steps * 1000
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    step_ms = (time.perf_counter() - started) / args.steps * 1000
    groups: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1000 / args.steps
        group = next((g for g, keys in GROUPS if any(k in event.key for k in keys)), "other ops")
        groups[group] += ms
        if group == "other ops":
            others[event.key] += ms
    groups["python and the rest"] = step_ms - sum(groups.values())
    print(
        f"{args.preset}, batch {args.batch}: {bare_ms:.1f} ms per decode step, "
        f"{step_ms:.1f} ms profiled"
    )
    for name, ms in groups.most_common():
        print(f"  {name:20} {ms:8.2f} ms  {ms / step_ms:6.1%}")
    print(
        "  the other ops' largest: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in others.most_common(6))
    )
    return {
        "bare_step_ms": round(bare_ms, 2),
        "step_ms": round(step_ms, 2),
        **{k: round(v, 2) for k, v in groups.items()},
    }


if __name__ == "__main__":
    run()
