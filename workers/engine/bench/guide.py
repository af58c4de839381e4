"""What constrained decoding costs: the same prompts and sampling on one engine, free, guided to
a JSON object, guided to a JSON schema (guide.py, llguidance), and a batch that mixes free and
guided sequences (their masks are filled and applied in the same batched sampler step). Output
tokens per second for each, best of --repeat interleaved runs, and the ratio to free; and the
sampler's time masking a step that has guided rows (the least of the runs' means): the guide's
own cost, apart from the model's and from how long the guided answers run; and the time of a
decode step while every sequence is still running (the median; the batch at its full size):
its ratio to free is the constrained-decoding overhead at that batch size, which tok/s blurs
(guided answers end sooner, so their batch thins out).

    python -m workers.engine.bench.guide [--preset small] [--requests 16] [--max-tokens 64]
    python -m workers.engine.bench --sections guide     (the same at batch 8)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.presets import ensure_preset

SCHEMA = {
    "type": "object",
    "required": ["city", "days"],
    "additionalProperties": False,
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
}


def _params(kind: str, max_tokens: int, seed: int) -> SamplingParams:
    common = {"max_tokens": max_tokens, "temperature": 1.0, "seed": seed}
    if kind == "free":
        return SamplingParams(ignore_eos=True, **common)
    if kind == "json_object":
        return SamplingParams(guide="json_object", **common)
    return SamplingParams(guide="json_schema", guide_schema=json.dumps(SCHEMA), **common)


def _run(
    engine: LLMEngine, prompts: list[list[int]], kinds: list[str], max_tokens: int
) -> tuple[float, int, float, float]:
    """Output tokens per second, tokens, the sampler's masking time per guided step (us), and
    the median time of a decode step with every sequence running (ms)."""
    requests = [(p, _params(kinds[i % len(kinds)], max_tokens, i)) for i, p in enumerate(prompts)]
    sampler = engine.runner.sampler
    sampler.guide_seconds, sampler.num_guided_steps = 0.0, 0
    start = time.perf_counter()
    for prompt, params in requests:
        engine.add_request(prompt, params)
    tokens, steps, full = 0, 0, []
    while engine.has_unfinished_requests():
        began = time.perf_counter()
        outputs = engine.step()
        took = time.perf_counter() - began
        steps += 1
        tokens += sum(len(output.new_token_ids) for output in outputs)
        # A decode step (after the prefill's) that every sequence is still part of.
        if steps > 2 and sum(1 for o in outputs if o.new_token_ids and not o.finished) == len(
            prompts
        ):
            full.append(took)
    mask_us = sampler.guide_seconds / max(sampler.num_guided_steps, 1) * 1e6
    step_ms = statistics.median(full) * 1000 if full else float("nan")
    return tokens / (time.perf_counter() - start), tokens, mask_us, step_ms


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m workers.engine.bench.guide",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", "--model", default="small")
    p.add_argument("--models-dir", type=Path, default=Path("var/models"))
    p.add_argument("--requests", type=int, default=16, help="sequences in flight together")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = ensure_preset(args.preset, args.models_dir)
    engine = LLMEngine(EngineConfig(model=str(model), max_num_seqs=args.requests))
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer.encode(f"Request {i}: the weather for a city, as JSON.")
        for i in range(args.requests)
    ]
    systems = {
        "free": ["free"],
        "json_object": ["json_object"],
        "json_schema": ["json_schema"],
        "mixed (half free, half schema)": ["free", "json_schema"],
    }
    _run(engine, prompts[:2], ["json_schema"], 8)  # build the tokenizer's view, compile the schema
    best: dict[str, tuple[float, int, float, float]] = {}
    masking: dict[str, list[float]] = {name: [] for name in systems}
    stepping: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.repeat):
        for name, kinds in systems.items():
            result = _run(engine, prompts, kinds, args.max_tokens)
            masking[name].append(result[2])
            if result[3] == result[3]:  # not NaN: it had full decode steps
                stepping[name].append(result[3])
            if name not in best or result[0] > best[name][0]:
                best[name] = result
    free, free_step = best["free"][0], min(stepping["free"])
    figures = {
        name: {
            "tok_s": round(tok_s, 1),
            "tokens": tokens,
            "x_free": round(tok_s / free, 2),
            "mask_us_per_step": round(min(masking[name])),
            "full_step_ms": round(min(stepping[name]), 2) if stepping[name] else None,
            "step_overhead": round(min(stepping[name]) / free_step - 1, 3)
            if stepping[name]
            else None,
        }
        for name, (tok_s, tokens, _, _) in best.items()
    }
    print(
        f"constrained decoding: preset {args.preset}, {args.requests} sequences together, up to "
        f"{args.max_tokens} tokens, temperature 1, best of {args.repeat}"
    )
    for name, row in figures.items():
        step = (
            f"step {row['full_step_ms']:.2f} ms, {row['step_overhead']:+.1%}"
            if row["full_step_ms"] is not None
            else "no full step"
        )
        print(
            f"  {name:<32}{row['tok_s']:>9.1f} tok/s  {row['x_free']:>5.2f}x free  "
            f"({row['tokens']} tokens; masks {row['mask_us_per_step']} us a guided step; "
            f"{step} at batch {args.requests})"
        )
    result = {
        "bench": "engine-guide",
        "preset": args.preset,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "results": figures,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run()
