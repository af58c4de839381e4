"""The quantization section: decode tok/s at batch 1 and 8, weight bytes, and the perplexity
change, for fp32, int8 and int4, in the same run.

Speed is measured on the ``medium`` preset (~135 M parameters, seeded, generated on first use,
never committed), where weights dominate a decode step; ``small`` is also measured. Perplexity
is measured on the trained target (held-out standard-library text), since random weights have
none worth comparing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.quant.modules import model_weight_bytes
from workers.engine.quantize.report import quant_report

METHODS = ("fp32", "int8", "int4")


def _decode_tok_s(engine: LLMEngine, batch: int, *, prompt_len: int, max_tokens: int) -> float:
    """Output tokens per second of the decode phase: ``batch`` prompts prefilled first (not
    timed)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [
        engine.add_request([5 + (i * 7 + j) % 250 for j in range(prompt_len)], params)
        for i in range(batch)
    ]
    while any(engine.requests[r].num_output_tokens == 0 for r in ids if r in engine.requests):
        engine.step()
    start, num_tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        num_tokens += sum(len(o.new_token_ids) for o in engine.step())
    return num_tokens / (time.perf_counter() - start)


def quant_speed(
    model_dir: Path, *, group_size: int, repeat: int, max_tokens: int
) -> dict[str, Any]:
    engines = {
        m: LLMEngine(
            EngineConfig(
                model=str(model_dir),
                quantization=None if m == "fp32" else m,
                quantization_group_size=group_size,
                max_num_seqs=16,
            )
        )
        for m in METHODS
    }
    rows: dict[str, Any] = {m: {**model_weight_bytes(e.runner.model)} for m, e in engines.items()}
    for engine in engines.values():
        _decode_tok_s(engine, 1, prompt_len=16, max_tokens=4)  # warm-up
    for batch in (1, 8):
        best = dict.fromkeys(METHODS, 0.0)
        for _ in range(repeat):  # interleaved; each keeps its fastest run
            for m, engine in engines.items():
                best[m] = max(
                    best[m], _decode_tok_s(engine, batch, prompt_len=64, max_tokens=max_tokens)
                )
        for m in METHODS:
            rows[m][f"decode_tok_s_batch{batch}"] = round(best[m], 1)
            rows[m][f"ratio_batch{batch}"] = round(best[m] / best["fp32"], 2)
    for m in METHODS:
        rows[m]["bytes_ratio"] = round(rows[m]["linear_bytes"] / rows["fp32"]["linear_bytes"], 4)
    return {"model": str(model_dir), "group_size": group_size, "methods": rows}


def quant_section(
    speed_models: list[Path],
    ppl_model: Path | None,
    windows: list[list[int]],
    *,
    group_size: int,
    repeat: int,
    quick: bool,
) -> dict[str, Any]:
    speed = [
        quant_speed(m, group_size=group_size, repeat=repeat, max_tokens=16 if quick else 48)
        for m in speed_models
    ]
    quality = (
        quant_report(ppl_model, windows, group_size=group_size) if ppl_model is not None else None
    )
    if quality is not None:
        for row in quality["methods"].values():
            row.pop(
                "relative_error", None
            )  # per layer: in `quant_report`, not in the bench summary
    return {"speed": speed, "quality": quality}


def quant_print(section: dict[str, Any]) -> None:
    for speed in section["speed"]:
        print(f"quantization speed: {speed['model']} (int4 groups of {speed['group_size']})")
        print(
            " "
            f" {'weights':<8}{'linear MB':>11}{'x fp32':>8}"
            f"{'b1 tok/s':>10}{'x':>7}{'b8 tok/s':>10}{'x':>7}"
        )
        for m, r in speed["methods"].items():
            print(
                " "
                f" {m:<8}{r['linear_bytes'] / 1e6:>11.1f}{r['bytes_ratio']:>8.3f}"
                f"{r['decode_tok_s_batch1']:>10.1f}"
                f"{r['ratio_batch1']:>7.2f}{r['decode_tok_s_batch8']:>10.1f}{r['ratio_batch8']:>7.2f}"
            )
    quality = section["quality"]
    if quality is None:
        print("quantization quality: no trained model (python manage.py preset_train)")
        return
    print(f"quantization quality: {quality['model']}, {quality['num_tokens']} held-out tokens")
    for m, r in quality["methods"].items():
        delta = f"{r['delta_perplexity']:+.2%}" if "delta_perplexity" in r else "-"
        print(
            f"  {m:<8} perplexity {r['perplexity']:.4f} ({delta}), top-1 agreement"
            f" {r['top1_agreement']:.4f},"
            f" linear {r['linear_bytes'] / 1e6:.1f} MB"
        )
