"""The speculation section: the trained target with and without speculative decoding, same run.

Workloads (greedy, fixed lengths): code completion (the first bytes of held-out standard-library
files) and "edit this text" (a held-out snippet, an instruction, then the snippet's start again:
an answer that repeats the prompt is what prompt lookup is for). Methods: n-gram prompt lookup
and the trained draft. Batch 1 (requests one after another) and batch 8 (eight at once), each
with speculation forced on and as the adaptive default decides. Greedy outputs are compared
token by token with the target alone.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.config import SpeculativeConfig
from workers.engine.spec.choice import MethodChoice
from workers.engine.spec.costs import StepCosts
from workers.engine.training.data import encode_bytes

EDIT_INSTRUCTION = b"\n\n# The same code again, with comments removed:\n\n"
SWEEP_BATCHES = (1, 2, 4, 8, 16)


def spec_workloads(
    heldout_files: list[Path], *, num: int, prompt_bytes: int
) -> dict[str, list[list[int]]]:
    files = [f for f in heldout_files if f.stat().st_size > 3 * prompt_bytes][:num]
    code = [encode_bytes(f.read_bytes()[:prompt_bytes]) for f in files]
    edit = []
    for f in files:
        snippet = f.read_bytes()[prompt_bytes : 2 * prompt_bytes]
        edit.append(encode_bytes(snippet + EDIT_INSTRUCTION + snippet[: prompt_bytes // 4]))
    return {"code": code, "edit": edit}


def _configs(target: Path, draft: Path, k: int) -> dict[str, SpeculativeConfig | None]:
    forced = {"is_adaptive": False, "disable_by_batch_size": None, "min_acceptance_rate": 0.0}
    return {
        "none": None,
        "ngram": SpeculativeConfig("ngram", num_speculative_tokens=k, **forced),
        "draft": SpeculativeConfig("draft", num_speculative_tokens=k, model=str(draft), **forced),
        "ngram_adaptive": SpeculativeConfig("ngram", num_speculative_tokens=k),
        "draft_adaptive": SpeculativeConfig("draft", num_speculative_tokens=k, model=str(draft)),
    }


def _run(engine: LLMEngine, prompts: list[list[int]], batch: int, max_tokens: int) -> tuple:
    """(output tok/s, outputs, CPU seconds, (drafts, draft tokens, accepted)) with ``batch``
    requests in flight at a time."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = engine.stats()
    start, cpu = time.perf_counter(), time.process_time()
    outputs = []
    for i in range(0, len(prompts), batch):
        outputs += [o.token_ids for o in engine.generate(prompts[i : i + batch], params)]
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = engine.stats()
    drafts = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
    drafted = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    return sum(map(len, outputs)) / elapsed, outputs, cpu, (drafts, drafted, accepted)


def _interleaved(
    engines: dict[str, LLMEngine],
    prompts: list[list[int]],
    batch: int,
    max_tokens: int,
    *,
    offset: int = 0,
) -> dict[str, tuple]:
    """``_run`` for every engine on the same prompts, interleaved: each group of ``batch``
    requests runs on every engine in turn (starting one further along each group, from
    ``offset``) before the next group starts, so a machine that slows down or speeds up within
    the run does so for every engine alike. Per engine, ``_run``'s tuple over all groups."""
    names = list(engines)
    totals: dict[str, list] = {n: [0, 0.0, [], 0.0, [0, 0, 0]] for n in names}
    for g, i in enumerate(range(0, len(prompts), batch)):
        start = (offset + g) % len(names)
        for name in names[start:] + names[:start]:
            group = prompts[i : i + batch]
            tok_s, outputs, cpu, spec = _run(engines[name], group, batch, max_tokens)
            total = totals[name]
            tokens = sum(map(len, outputs))
            total[0] += tokens
            total[1] += tokens / tok_s if tok_s else 0.0
            total[2] += outputs
            total[3] += cpu
            total[4] = [a + b for a, b in zip(total[4], spec, strict=True)]
    return {
        name: (tokens / elapsed if elapsed else 0.0, outputs, cpu, tuple(spec))
        for name, (tokens, elapsed, outputs, cpu, spec) in totals.items()
    }


def spec_engines(target: Path, draft: Path, k: int, warmup: list[int]) -> dict[str, LLMEngine]:
    """One engine per mode, each warmed up (one-time costs out of the timing)."""
    engines = {
        name: LLMEngine(EngineConfig(model=str(target), speculative=spec, max_num_seqs=16))
        for name, spec in _configs(target, draft, k).items()
    }
    for engine in engines.values():
        engine.generate(
            [warmup[:40]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        )
    return engines


def spec_section(
    target: Path,
    draft: Path,
    heldout_files: list[Path],
    *,
    quick: bool,
    repeat: int,
    k: int = 4,
    sweep_batches: tuple[int, ...] = SWEEP_BATCHES,
    sweep_repeat: int = 3,
    sweep_workloads: tuple[str, ...] = ("edit",),
    table: bool = True,
) -> dict[str, Any]:
    """The table (batch 1 and 8, each mode's fastest of ``repeat`` runs; ``table`` False: left
    out), then the sweep over ``sweep_batches`` on ``sweep_workloads`` (``sweep_repeat`` 0:
    none)."""
    num = 4 if quick else 16
    workloads = spec_workloads(heldout_files, num=num, prompt_bytes=192)
    max_tokens = 32 if quick else 128
    engines = spec_engines(target, draft, k, workloads["code"][0])
    rows: dict[str, Any] = {}
    for workload, prompts in workloads.items() if table else ():
        for batch in (1, min(8, num)):
            best: dict[str, tuple[float, list[list[int]], float, tuple[int, int, int]]] = {}
            for _ in range(repeat):  # interleaved; each keeps its fastest run
                for name, engine in engines.items():
                    run = _run(engine, prompts, batch, max_tokens)
                    if name not in best or run[0] > best[name][0]:
                        best[name] = run
            rows[f"{workload}_batch{batch}"] = _row(best)
    section = {
        "target": str(target),
        "draft": str(draft),
        "num_speculative_tokens": k,
        "num_prompts": num,
        "max_tokens": max_tokens,
        "prompt_bytes": 192,
        "results": rows,
    }
    if sweep_repeat > 0:
        section["sweep"] = spec_sweep(
            engines,
            {w: workloads[w] for w in sweep_workloads},
            batch_sizes=sweep_batches,
            repeat=sweep_repeat,
            max_tokens=max_tokens,
        )
    return section


def spec_sweep(
    engines: dict[str, LLMEngine],
    workloads: dict[str, list[list[int]]],
    *,
    batch_sizes: tuple[int, ...],
    repeat: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Every mode at every batch size, ``repeat`` rounds. Within a round every mode runs the
    cell once, interleaved by groups of ``batch`` requests (``_interleaved``: each group on
    every mode in turn, starting one further along each group and round), so drift on a shared
    machine hits them alike; each run's tok/s, and its process CPU seconds, are compared with
    ``none``'s of the same round. Per mode and batch size: the median ratio and its spread
    (min-max over rounds), on wall time and on CPU seconds; per adaptive mode and measure,
    whether it is at least ``none``, at least 0.95x its own forced method and at least 0.95x
    the best forced method (medians). At batch b there are max(b, prompts) requests (prompts
    repeated), b in flight at a time."""
    names = list(engines)
    results: dict[str, Any] = {}
    load_start = _load()
    for workload, prompts in workloads.items():
        per_batch: dict[str, Any] = {}
        for batch in batch_sizes:
            cell = [prompts[i % len(prompts)] for i in range(max(batch, len(prompts)))]
            runs: dict[str, list[tuple]] = {n: [] for n in names}
            load = [_load()]
            for r in range(repeat):
                for name, run in _interleaved(engines, cell, batch, max_tokens, offset=r).items():
                    runs[name].append(run)
                    print(
                        f"[spec sweep] {workload} batch {batch} round {r + 1}: {name}"
                        f" {run[0]:.1f} tok/s, {run[2]:.2f} CPU s",
                        file=sys.stderr,
                        flush=True,
                    )
            load.append(_load())
            per_batch[str(batch)] = {**_sweep_cell(runs), "load_avg": load}
        results[workload] = per_batch
    adaptive: dict[str, StepCosts] = {}  # the adaptive engines' cost models
    choices: dict[str, dict] = {}  # an engine with a method choice: what it chose and measured
    for name, engine in engines.items():
        speculator = engine.speculator
        if speculator is None or not speculator.config.is_adaptive:
            continue
        if isinstance(speculator, MethodChoice):
            choices[name] = speculator.snapshot()
            for method, inner in speculator.methods.items():
                adaptive[f"{name}/{method}"] = inner.costs
        else:
            adaptive[name] = speculator.costs
    return {
        "batch_sizes": list(batch_sizes),
        "repeat": repeat,
        "max_tokens": max_tokens,
        "modes": names,
        # The 1-minute load average when the sweep started and ended (2 cores: above 2, the
        # runs waited for the cores).
        "load_avg": [load_start, _load()],
        "results": results,
        # What the adaptive engines had measured by the end: per batch-size bucket, one
        # sequence's share of a plain step, what a draft token adds, and their quotient (the
        # acceptance rate above which speculating pays).
        "costs": {name: costs.snapshot() for name, costs in adaptive.items()},
        # What a token a draft model catches up on costs (microseconds), as the adaptive
        # engines had measured it by the end (None: not measured, or no draft model).
        "catch_up_us": {name: costs.catch_up_us() for name, costs in adaptive.items()},
        # Per batch-size bucket, the method its steps went to, and the steps each method had.
        "choices": choices,
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


MEASURES = ("wall", "cpu")


def _sweep_cell(runs: dict[str, list[tuple]]) -> dict[str, Any]:
    base = runs["none"]
    cell: dict[str, Any] = {}
    for name, mode_runs in runs.items():
        pairs = list(zip(mode_runs, base, strict=True))
        # Wall: tok/s over none's tok/s. CPU: none's CPU seconds over this mode's, for the same
        # tokens (greedy, fixed lengths): tokens per CPU second, less hurt by descheduling.
        wall = sorted(run[0] / b[0] for run, b in pairs)
        cpu = sorted(b[2] / run[2] for run, b in pairs if run[2] > 0)
        drafted = sum(run[3][1] for run in mode_runs)
        accepted = sum(run[3][2] for run in mode_runs)
        cell[name] = {
            "tok_s": [round(run[0], 1) for run in mode_runs],
            "cpu_s": [round(run[2], 2) for run in mode_runs],
            "ratio": round(statistics.median(wall), 3),
            "ratio_min": round(wall[0], 3),
            "ratio_max": round(wall[-1], 3),
            "cpu_ratio": round(statistics.median(cpu), 3) if cpu else None,
            "cpu_ratio_min": round(cpu[0], 3) if cpu else None,
            "cpu_ratio_max": round(cpu[-1], 3) if cpu else None,
            # Draft tokens per run (the adaptive modes' beside their forced method's: how much
            # they speculated) and the share accepted.
            "draft_tokens": round(drafted / len(mode_runs)),
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "greedy_identical": all(run[1] == b[1] for run, b in pairs),
        }
    cell["checks"] = {
        measure: _checks(cell, "ratio" if measure == "wall" else "cpu_ratio")
        for measure in MEASURES
    }
    return cell


def _checks(cell: dict[str, Any], key: str) -> dict[str, Any]:
    """Per adaptive mode: >= none, >= 0.95x its own forced method, >= 0.95x the best forced
    method (all medians of ``key``)."""
    forced = [n for n in cell if n != "none" and not n.endswith("_adaptive")]
    best = max(forced, key=lambda n: cell[n][key] or 0.0) if forced else None
    checks: dict[str, Any] = {}
    for name in cell:
        own = name.removesuffix("_adaptive")
        if own == name or own not in cell or cell[name][key] is None:
            continue
        ratio, own_ratio = cell[name][key], cell[own][key]
        best_ratio = cell[best][key] if best else None
        checks[name] = {
            "at_least_none": ratio >= 1.0,
            "within_5pct_of_forced": bool(own_ratio) and ratio >= 0.95 * own_ratio,
            "vs_forced": round(ratio / own_ratio, 3) if own_ratio else None,
            "best_forced": best,
            "within_5pct_of_best_forced": bool(best_ratio) and ratio >= 0.95 * best_ratio,
            "vs_best_forced": round(ratio / best_ratio, 3) if best_ratio else None,
        }
    return checks


def _row(best: dict[str, tuple]) -> dict[str, Any]:
    base_tok_s, base_outs, base_cpu, _ = best["none"]
    row: dict[str, Any] = {"none": {"tok_s": round(base_tok_s, 1), "cpu_s": round(base_cpu, 2)}}
    for name, (tok_s, outs, cpu, (drafts, drafted, accepted)) in best.items():
        if name == "none":
            continue
        row[name] = {
            "tok_s": round(tok_s, 1),
            "ratio": round(tok_s / base_tok_s, 2),
            "cpu_s": round(cpu, 2),
            "cpu_ratio": round(base_cpu / cpu, 2) if cpu else None,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "mean_acceptance_length": round(1 + accepted / drafts, 2) if drafts else None,
            "greedy_identical": outs == base_outs,
        }
    return row


def spec_print(section: dict[str, Any]) -> None:
    print(
        f"speculation: target {section['target']}, draft {section['draft']},"
        f" k={section['num_speculative_tokens']},"
        f" {section['num_prompts']} prompts of {section['prompt_bytes']} bytes,"
        f" {section['max_tokens']} tokens each, greedy"
    )
    header = (
        f"  {'workload':<16}{'method':<16}{'tok/s':>9}{'x none':>8}{'CPU x':>8}{'accept':>8}"
        f"{'mean len':>10}  identical"
    )
    if section["results"]:
        print(header)
    for workload, row in section["results"].items():
        print(f"  {workload:<16}{'none':<16}{row['none']['tok_s']:>9.1f}")
        for name, r in row.items():
            if name == "none":
                continue
            accept = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
            length = (
                "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
            )
            print(
                " "
                f" {'':<16}{name:<16}{r['tok_s']:>9.1f}{r['ratio']:>8.2f}"
                f"{r['cpu_ratio'] or 0:>8.2f}{accept:>8}{length:>10}  {r['greedy_identical']}"
            )
    if "sweep" in section:
        spec_sweep_print(section["sweep"])


def spec_sweep_print(sweep: dict[str, Any]) -> None:
    load = sweep.get("load_avg", [None, None])
    print(
        f"speculation sweep: {sweep['max_tokens']} tokens per request, {sweep['repeat']} rounds,"
        " modes interleaved; ratio to none, median [min-max over rounds], wall (tok/s) and CPU"
        f" (process CPU seconds); load average {load[0]} at start, {load[1]} at end"
    )
    modes = [m for m in sweep["modes"] if m != "none"]
    for workload, per_batch in sweep["results"].items():
        print(
            f"  {workload:<6}{'batch':>6}{'none tok/s':>12}{'':>2}"
            + "".join(f"{m:<36}" for m in modes)
        )
        for batch, cell in per_batch.items():
            none = statistics.median(cell["none"]["tok_s"])
            line = f"  {'':<6}{batch:>6}{none:>12.1f}{'':>2}"
            for m in modes:
                c = cell[m]
                mark = "" if c["greedy_identical"] else "!"
                text = f"{c['ratio']:.2f} [{c['ratio_min']:.2f}-{c['ratio_max']:.2f}]"
                if c["cpu_ratio"] is not None:
                    text += f" cpu {c['cpu_ratio']:.2f} [{c['cpu_ratio_min']:.2f}-"
                    text += f"{c['cpu_ratio_max']:.2f}]"
                line += f"{text + mark:<36}"
            print(line)
            for measure, checks in cell["checks"].items():
                for name, check in checks.items():
                    print(
                        f"  {'':<12}{measure:<5}{name}: >= none {_yes(check['at_least_none'])},"
                        f" >= 0.95x {name.removesuffix('_adaptive')}"
                        f" {_yes(check['within_5pct_of_forced'])} ({check['vs_forced']}x),"
                        f" >= 0.95x best forced ({check['best_forced']})"
                        f" {_yes(check['within_5pct_of_best_forced'])}"
                        f" ({check['vs_best_forced']}x)"
                    )
            if "load_avg" in cell:
                print(f"  {'':<12}load average {cell['load_avg'][0]} -> {cell['load_avg'][1]}")
    for name, buckets in sweep.get("costs", {}).items():
        text = ", ".join(
            f"{b}: {c['break_even_acceptance']}" for b, c in buckets.items() if c["plain_us"]
        )
        catch_up = sweep.get("catch_up_us", {}).get(name)
        if catch_up is not None:
            text += f"; catch-up {catch_up} us a token"
        print(f"  {name} break-even acceptance per batch bucket: {text}")
    for name, choice in sweep.get("choices", {}).items():
        steps = "; ".join(
            f"{method} (acceptance {m['acceptance']}, drafted/accepted a try {m['per_try']}) "
            + ", ".join(f"{b}: {n}" for b, n in m["steps"].items())
            for method, m in choice["methods"].items()
        )
        chosen = ", ".join(f"{b}: {method}" for b, method in choice["chosen"].items())
        print(f"  {name} chose per batch bucket: {chosen}; steps per method and bucket: {steps}")
    print("  (! after a ratio: greedy output differed from none's)")


def _yes(value: bool) -> str:
    return "yes" if value else "NO"
