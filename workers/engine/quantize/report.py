"""What weight quantization costs a model: relative error per layer, weight bytes, perplexity on
held-out text and greedy top-1 agreement with the unquantized model (fp32 vs int8 vs int4)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from workers.engine.config import ModelConfig
from workers.engine.loader import model_load
from workers.engine.model.attention import AttentionGroup, AttentionMetadata
from workers.engine.model.llama import LlamaModel
from workers.engine.quant.formats import (
    int4_dequantize,
    int4_quantize,
    int8_dequantize,
    int8_quantize,
    relative_error,
)
from workers.engine.quant.modules import QUANTIZED_MODULES, model_weight_bytes, quantize_model


def model_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one window, causal, without the paged cache's bookkeeping:
    [len(ids), vocab] (float32, CPU)."""
    mc: ModelConfig = model.config
    device = model.embed_tokens.weight.device
    dtype = model.embed_tokens.weight.dtype
    n = len(ids)
    caches = [
        (
            torch.empty(mc.num_key_value_heads, 1, n, mc.head_dim, device=device, dtype=dtype),
            torch.empty(mc.num_key_value_heads, 1, n, mc.head_dim, device=device, dtype=dtype),
        )
        for _ in range(mc.num_hidden_layers)
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=device),
        groups=[AttentionGroup(1, n, 0, None, None, rows=slice(0, n))],
    )
    hidden = model(torch.tensor(ids, device=device), torch.arange(n, device=device), caches, meta)
    return model.compute_logits(hidden).float().cpu()


def score(
    model: LlamaModel, windows: list[list[int]], reference: list[torch.Tensor] | None = None
) -> dict[str, Any]:
    """Perplexity (per token) over ``windows``; with reference argmaxes, greedy top-1 agreement."""
    nll, count, agree = 0.0, 0, 0
    argmaxes = []
    for i, window in enumerate(windows):
        logits = model_logits(model, window)[:-1]
        targets = torch.tensor(window[1:])
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
        top = logits.argmax(dim=-1)
        argmaxes.append(top)
        if reference is not None:
            agree += int((top == reference[i]).sum())
    result = {"perplexity": math.exp(nll / count), "num_tokens": count, "argmax": argmaxes}
    if reference is not None:
        result["top1_agreement"] = agree / count
    return result


def layer_errors(model: LlamaModel, method: str, *, group_size: int) -> dict[str, float]:
    """||W - W~|| / ||W|| of every quantizable layer of an unquantized model."""
    errors = {}
    for i, layer in enumerate(model.layers):
        for path in QUANTIZED_MODULES:
            parent, child = path.split(".")
            weight = getattr(getattr(layer, parent), child).weight.detach().float().cpu()
            if method == "int8":
                approx = int8_dequantize(*int8_quantize(weight))
            else:
                codes, scale, zero = int4_quantize(weight, group_size)
                approx = int4_dequantize(codes, scale, zero, group_size)[:, : weight.shape[1]]
            errors[f"layers.{i}.{path}"] = round(relative_error(weight, approx), 6)
    return errors


def quant_report(
    model_dir: str | Path,
    windows: list[list[int]],
    *,
    methods: tuple[str, ...] = ("int8", "int4"),
    group_size: int = 128,
    device: str = "cpu",
) -> dict[str, Any]:
    """fp32 and each method on the same held-out windows."""
    torch_device = torch.device(device)

    def load() -> LlamaModel:
        return model_load(
            model_dir,
            device=torch_device,
            dtype=torch.float32,
            max_positions=max(map(len, windows)),
        )

    dense = load()
    base = score(dense, windows)
    rows: dict[str, Any] = {
        "fp32": {
            "perplexity": round(base["perplexity"], 4),
            "top1_agreement": 1.0,
            **model_weight_bytes(dense),
        }
    }
    for method in methods:
        errors = layer_errors(dense, method, group_size=group_size)
        model = load()
        kernels = quantize_model(model, method, group_size=group_size)
        scored = score(model, windows, base["argmax"])
        rows[method] = {
            "perplexity": round(scored["perplexity"], 4),
            "delta_perplexity": round(scored["perplexity"] / base["perplexity"] - 1, 5),
            "top1_agreement": round(scored["top1_agreement"], 5),
            **model_weight_bytes(model),
            "kernels": sorted(set(kernels.values())),
            "relative_error_mean": round(sum(errors.values()) / len(errors), 6),
            "relative_error_max": max(errors.values()),
            "relative_error": errors,
        }
        rows[method]["bytes_ratio"] = round(
            rows[method]["linear_bytes"] / rows["fp32"]["linear_bytes"], 4
        )
        del model
    return {
        "model": str(model_dir),
        "group_size": group_size,
        "num_windows": len(windows),
        "num_tokens": base["num_tokens"],
        "device": device,
        "methods": rows,
    }
