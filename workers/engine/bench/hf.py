"""Hugging Face transformers baselines on the same weights: one at a time, static batches, and
transformers' own continuous batching (``generate_batch``'s manager) where it runs on this box."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from workers.engine.bench.results import RunResult, tpots
from workers.engine.bench.workload import Request

PAD_ID = 0


def hf_model_load(model_dir: Path):
    """The architecture config.json names (Qwen2 keeps its QKV biases, which transformers'
    Llama class would drop and warn about), so both systems run the same model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # fixed output lengths, like ignore_eos
    model.generation_config.pad_token_id = PAD_ID
    return model


class _FirstToken:
    """A logits processor that notes when the first token of a generate call is chosen."""

    def __init__(self) -> None:
        self.time: float | None = None

    def __call__(self, input_ids, scores):
        if self.time is None:
            self.time = time.perf_counter()
        return scores


def hf_one_at_a_time(model, requests: list[Request]) -> RunResult:
    _warm_up(model)
    start, cpu_start = time.perf_counter(), time.process_time()
    ttft, done = [], []
    for r in requests:
        first = _FirstToken()
        _generate(model, [r.prompt], r.num_output_tokens, first)
        ttft.append(first.time - start)
        done.append(time.perf_counter() - start)
    return RunResult(
        "hf_one_at_a_time",
        time.perf_counter() - start,
        _useful(requests),
        ttft,
        time.process_time() - cpu_start,
        tpot_s=tpots(requests, ttft, done),
    )


def hf_static_batches(model, requests: list[Request], batch_size: int) -> RunResult:
    """Arrival-order batches, left-padded; a batch runs until its longest output is done."""
    _warm_up(model)
    start, cpu_start = time.perf_counter(), time.process_time()
    ttft, done = [], []
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        first = _FirstToken()
        _generate(model, [r.prompt for r in batch], max(r.num_output_tokens for r in batch), first)
        ttft.extend([first.time - start] * len(batch))
        done.extend([time.perf_counter() - start] * len(batch))  # generate returns them all
    return RunResult(
        f"hf_static_batch_{batch_size}",
        time.perf_counter() - start,
        _useful(requests),
        ttft,
        time.process_time() - cpu_start,
        tpot_s=tpots(requests, ttft, done),
    )


def hf_continuous_batching(
    model, requests: list[Request], *, max_batch_tokens: int, num_blocks: int
) -> RunResult:
    """transformers' continuous batching manager (what ``generate_batch`` uses), per-request
    lengths."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=PAD_ID,
        max_new_tokens=max(r.num_output_tokens for r in requests),
    )
    cb = ContinuousBatchingConfig(
        page_size=256,
        num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=len(requests),
        use_cuda_graph=False,
    )
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        _cb_collect(manager, [Request([5] * 40, 4)])  # warm-up
        start, cpu_start = time.perf_counter(), time.process_time()
        outputs = _cb_collect(manager, requests)
        makespan, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        manager.stop(block=True, timeout=10)
    num_tokens = sum(len(o.generated_tokens) for o in outputs)
    ttft = [o.timestamps[0] - start for o in outputs if o.timestamps]
    tpot = [
        (o.timestamps[-1] - o.timestamps[0]) / (len(o.timestamps) - 1)
        for o in outputs
        if len(o.timestamps) > 1
    ]
    return RunResult("hf_continuous_batching", makespan, num_tokens, ttft, cpu, tpot_s=tpot)


def _cb_collect(manager, requests: list[Request]) -> list:
    ids = [
        manager.add_request(r.prompt, max_new_tokens=r.num_output_tokens, record_timestamps=True)
        for r in requests
    ]
    done = {}
    while len(done) < len(ids):
        result = manager.get_result(timeout=1)
        if result is not None and result.is_finished():
            if result.error:
                raise RuntimeError(f"transformers continuous batching failed: {result.error}")
            done[result.request_id] = result
        elif result is None and not manager.is_running():
            raise RuntimeError("transformers continuous batching loop stopped")
    return [done[i] for i in ids]


def _generate(
    model, prompts: list[list[int]], max_new_tokens: int, first: _FirstToken
) -> torch.Tensor:
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_ID] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            logits_processor=[first],
        )


def _warm_up(model) -> None:
    _generate(model, [[5] * 40, [6] * 20], 4, _FirstToken())


def _useful(requests: list[Request]) -> int:
    return sum(r.num_output_tokens for r in requests)
