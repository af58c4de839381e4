"""python -m workers.engine.quantize [MODEL_DIR ...] [--methods int8,int4] [--group-size 128]
[--windows 24] [--window-length 256] [--json-out PATH] [--save-dir DIR]

The quantization report on held-out standard-library text: per model, fp32 vs int8 vs int4
(relative error per layer, weight bytes, perplexity, greedy top-1 agreement). Without model
directories it reports on the trained pair (``preset_train`` makes it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from workers.engine.quantize.report import quant_report
from workers.engine.quantize.save import quantized_save
from workers.engine.training.data import corpus_load
from workers.engine.training.train import trained_dir


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m workers.engine.quantize",
        description=__doc__.splitlines()[2],
    )
    p.add_argument(
        "models", nargs="*", type=Path, help="model directories (default: the trained pair)"
    )
    p.add_argument(
        "--models-dir", type=Path, default=Path("var/models"), help="where the trained pair lives"
    )
    p.add_argument("--methods", default="int8,int4")
    p.add_argument("--group-size", type=int, default=128, choices=[32, 64, 128])
    p.add_argument("--windows", type=int, default=24, help="held-out windows scored")
    p.add_argument("--window-length", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument(
        "--save-dir", type=Path, default=None, help="also write each quantized checkpoint here"
    )
    return p.parse_args(argv)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    models = args.models or [trained_dir(p, args.models_dir) for p in ("small", "draft")]
    missing = [m for m in models if not (m / "config.json").exists()]
    if missing:
        raise SystemExit(
            f"no model at {', '.join(map(str, missing))}; train the pair first: "
            "python manage.py preset_train (or python -m workers.engine.training)"
        )
    windows = (
        corpus_load()
        .windows("heldout", num=args.windows, length=args.window_length, seed=7)
        .tolist()
    )
    methods = tuple(m for m in args.methods.split(",") if m)
    reports = [
        quant_report(m, windows, methods=methods, group_size=args.group_size) for m in models
    ]
    for report in reports:
        report_print(report)
    saved = []
    if args.save_dir is not None:
        for model in models:
            for method in methods:
                saved.append(
                    str(
                        quantized_save(
                            model,
                            args.save_dir / f"{model.name}-{method}",
                            method,
                            group_size=args.group_size,
                        )
                    )
                )
                print(f"saved {saved[-1]}")
    result = {"benchmark": "quant_report", "reports": reports, "saved": saved}
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, separators=(",", ":")))
    sys.stdout.flush()
    return result


def report_print(report: dict[str, Any]) -> None:
    print(
        f"{report['model']}: {report['num_windows']} held-out windows, {report['num_tokens']}"
        f" tokens, int4 groups of {report['group_size']}"
    )
    print(
        " "
        f" {'weights':<8}{'perplexity':>12}{'d ppl':>10}{'top-1 agree':>13}{'linear MB':>11}"
        f"{'x fp32':>8}{'rel err mean/max':>20}  kernels"
    )
    for name, row in report["methods"].items():
        delta = f"{row['delta_perplexity']:+.2%}" if "delta_perplexity" in row else "-"
        ratio = f"{row.get('bytes_ratio', 1.0):.3f}"
        errors = (
            f"{row['relative_error_mean']:.4f}/{row['relative_error_max']:.4f}"
            if "relative_error_mean" in row
            else "-"
        )
        print(
            f"  {name:<8}{row['perplexity']:>12.4f}{delta:>10}{row['top1_agreement']:>13.4f}"
            f"{row['linear_bytes'] / 1e6:>11.2f}{ratio:>8}{errors:>20} "
            f" {','.join(row.get('kernels', []))}"
        )


if __name__ == "__main__":
    run()
