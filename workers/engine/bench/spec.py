"""The speculation section: the trained target with and without speculative decoding, same run.

Workloads (greedy, fixed lengths): code completion (the first bytes of held-out standard-library
files) and "edit this text" (a held-out snippet, an instruction, then the snippet's start again:
an answer that repeats the prompt is what prompt lookup is for). Methods: n-gram prompt lookup
and the trained draft. Batch 1 (requests one after another) and batch 8 (eight at once), each
with speculation forced on and as the adaptive default decides. Greedy outputs are compared
token by token with the target alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.config import SpeculativeConfig
from workers.engine.training.data import encode_bytes

EDIT_INSTRUCTION = b"\n\n# The same code again, with comments removed:\n\n"


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
    forced = {"disable_by_batch_size": None, "min_acceptance_rate": 0.0}
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


def spec_section(
    target: Path, draft: Path, heldout_files: list[Path], *, quick: bool, repeat: int, k: int = 4
) -> dict[str, Any]:
    num = 4 if quick else 16
    workloads = spec_workloads(heldout_files, num=num, prompt_bytes=192)
    max_tokens = 32 if quick else 128
    configs = _configs(target, draft, k)
    engines = {
        name: LLMEngine(EngineConfig(model=str(target), speculative=spec, max_num_seqs=16))
        for name, spec in configs.items()
    }
    for engine in engines.values():  # one-time costs out of the timing
        engine.generate(
            [workloads["code"][0][:40]],
            SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        )
    rows: dict[str, Any] = {}
    for workload, prompts in workloads.items():
        for batch in (1, min(8, num)):
            best: dict[str, tuple[float, list[list[int]], float, tuple[int, int, int]]] = {}
            for _ in range(repeat):  # interleaved; each keeps its fastest run
                for name, engine in engines.items():
                    run = _run(engine, prompts, batch, max_tokens)
                    if name not in best or run[0] > best[name][0]:
                        best[name] = run
            rows[f"{workload}_batch{batch}"] = _row(best)
    return {
        "target": str(target),
        "draft": str(draft),
        "num_speculative_tokens": k,
        "num_prompts": num,
        "max_tokens": max_tokens,
        "prompt_bytes": 192,
        "results": rows,
    }


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
