"""Calibration: the real engine stepped over a grid of batch compositions, each step's time
taken from the engine's own step record (the figures a worker publishes)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.planner.stepmodel import StepSample

_FIRST_BYTE_ID, _LAST_BYTE_ID = 5, 260  # the preset tokenizer's byte tokens


@dataclass(frozen=True, slots=True)
class Grid:
    """Decoding sequences held, their prompt length, and prefill chunks added beside them;
    every point is measured ``repeats`` times."""

    decode_seqs: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 48, 63)
    contexts: tuple[int, ...] = (32, 256, 640)
    prefills: tuple[int, ...] = (0, 16, 64, 256, 512)
    repeats: int = 3


QUICK = Grid(decode_seqs=(0, 1, 4, 12), contexts=(32, 160), prefills=(0, 32, 128), repeats=2)


def calibrate(
    model_dir: str | Path,
    *,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 1024,
    num_threads: int | None = None,
    grid: Grid = Grid(),
    seed: int = 0,
) -> list[StepSample]:
    """Step the engine over every (decodes, context, prefill) point of the grid that fits
    ``max_num_seqs`` and the token budget; return every step's measured sample."""
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            is_prefix_caching_enabled=False,  # random prompts never hit; keep every step cold
            num_threads=num_threads,
        )
    )
    rng = random.Random(seed)
    engine.generate([_prompt(rng, 40)], SamplingParams(max_tokens=4, ignore_eos=True))  # warm
    samples: list[StepSample] = []
    longest = engine.max_model_len - 8
    # Counts beyond the engine's slots measure its fullest batch instead.
    for num_decodes in sorted({min(d, max_num_seqs - 1) for d in grid.decode_seqs}):
        for context in grid.contexts:
            if context + 2 * len(grid.prefills) * grid.repeats + 8 > longest:
                continue
            samples.extend(_point(engine, rng, num_decodes, context, grid, max_num_batched_tokens))
    return samples


def _point(
    engine: LLMEngine,
    rng: random.Random,
    num_decodes: int,
    context: int,
    grid: Grid,
    budget: int,
) -> list[StepSample]:
    num_steps = 2 * len(grid.prefills) * grid.repeats + 4
    held = [
        engine.add_request(
            _prompt(rng, context),
            SamplingParams(max_tokens=num_steps + 4, ignore_eos=True, temperature=0.0),
        )
        for _ in range(num_decodes)
    ]
    samples: list[StepSample] = []
    while engine.scheduler.waiting or any(s.is_prefilling for s in engine.scheduler.running):
        samples.append(_step(engine))  # the held prompts' prefill: samples too
    for prefill in grid.prefills:
        if prefill + num_decodes > budget:
            continue
        for _ in range(grid.repeats):
            if prefill:
                engine.add_request(
                    _prompt(rng, prefill), SamplingParams(max_tokens=1, ignore_eos=True)
                )
            samples.append(_step(engine))  # the prefill beside the decodes
            if num_decodes:
                samples.append(_step(engine))  # decodes alone
    for request_id in held:
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return samples


def _step(engine: LLMEngine) -> StepSample:
    engine.step()
    return StepSample.from_row(engine.stats_counters.step_samples[-1])


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(_FIRST_BYTE_ID, _LAST_BYTE_ID) for _ in range(n)]
