"""The human-readable part of the benchmark output."""

from __future__ import annotations

from typing import Any


def report_print(result: dict[str, Any]) -> None:
    w = result["workload"]
    print(
        f"engine benchmark: preset={result['preset']} threads={result['threads']}"
        f" seed={result['seed']}"
        f" quick={result['quick']} repeat={result['repeat']} (fastest run of each)"
        f" machine={result['machine']}"
    )
    print(
        f"mixed workload: {w['num_requests']} requests, prompts"
        f" {w['prompt_range'][0]}-{w['prompt_range'][1]}"
        f" ({w['prompt_tokens']} tokens), outputs {w['output_range'][0]}-{w['output_range'][1]}"
        f" ({w['output_tokens']} tokens)"
    )
    header = (
        f"{'system':<28}{'out tok/s':>11}{'makespan s':>12}{'TTFT p50 s':>12}{'TTFT p99 s':>12}"
        f"{'CPU s':>9}{'ours x':>9}{'TPOT p50 ms':>13}"
    )
    print(header)
    print("-" * len(header))
    print(_row(result["ours"], None))
    for name, summary in result["baselines"].items():
        print(_row(summary, result["ratios"][name]["throughput"]))
    for summary in result["baselines"].values():
        if summary.get("note"):
            print(f"  note {summary['name']}: {summary['note']}")
    ours = result["ours"]
    print(
        f"ours: KV waste {ours['kv_waste']:.2%} of reserved slots, mean {ours['batch_seqs_mean']}"
        " sequences/step,"
        f" {ours['num_steps']} steps, {ours['num_preemptions']} preemptions"
    )
    s = result["shared_prefix"]
    print(
        f"shared prefix: {s['num_requests']} requests, {s['system_prompt_tokens']}-token system"
        " prompt,"
        f" user turns {s['user_turn_range'][0]}-{s['user_turn_range'][1]}: prefix hit rate"
        f" {s['prefix_hit_rate']:.1%}"
    )
    print(_row(s["cache_on"], None))
    print(_row(s["cache_off"], None))
    print(
        f"  prefix caching: TTFT p50 {s['ttft_p50_speedup']}x, p99 {s['ttft_p99_speedup']}x faster;"
        f" throughput {s['throughput_speedup']}x"
    )
    cpu = ", ".join(
        f"{k} {v['cpu_time']}x" for k, v in result["ratios"].items() if v.get("cpu_time")
    )
    print(f"ours vs baselines in CPU seconds for the same work: {cpu}")
    m = result.get("matmul")
    if m:
        shares = ", ".join(
            f"{name} {v['gflops']} GFLOP/s ({v['peak_fraction']:.0%})"
            for name, v in m.items()
            if isinstance(v, dict)
        )
        print(
            f"matrix multiplies ({m['matmul_params'] / 1e6:.1f} M weights x {m['tokens']} tokens;"
            f" this machine's fp32 peak {m['peak_gflops']} GFLOP/s): {shares}"
        )


def _row(s: dict[str, Any], ratio: float | None) -> str:
    if s.get("note") and not s.get("makespan_s"):
        return f"{s['name']:<28}{'-':>11}{'-':>12}{'-':>12}{'-':>12}{'-':>9}{'-':>9}{'-':>13}"
    ratio_text = "" if ratio is None else f"{ratio:.2f}"
    return (
        f"{s['name']:<28}{s['output_tok_s']:>11.1f}{s['makespan_s']:>12.2f}{s['ttft_p50_s']:>12.3f}"
        f"{s['ttft_p99_s']:>12.3f}{s['cpu_s']:>9.1f}{ratio_text:>9}"
        f"{'' if s.get('tpot_p50_ms') is None else s['tpot_p50_ms']:>13}"
    )
