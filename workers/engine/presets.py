"""Preset models: seeded random weights written as an ordinary Hugging Face model directory.

The directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) loads unchanged in transformers' LlamaForCausalLM, which is what the
equality tests rely on. Nothing is downloaded: weights come from a seeded generator.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from workers.engine.tokenizer import PRESET_SPECIAL_TOKENS, PRESET_VOCAB_SIZE, byte_tokenizer_write

PRESET_FORMAT_VERSION = 1
PRESETS: dict[str, dict[str, Any]] = {
    # Tests: a forward pass takes well under a millisecond.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
    },
    # Benchmarks: ~25 M parameters, so matrix multiplies rather than Python dominate a step.
    "small": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
    },
    # The draft of speculative decoding for `small`: the same tokenizer, ~15x fewer parameters.
    "draft": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
    },
    # The quantization benchmark: ~135 M parameters, so weights dominate a decode step.
    # Generated from its seed when a benchmark asks; never committed.
    "medium": {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
    },
    # A real model's shape (issue 34): Qwen2-0.5B's layers, widths, heads, grouped KV heads,
    # QKV biases and RoPE base, with the byte tokenizer's vocabulary instead of its 151,936
    # entries (so the LM head is ~0.2 M parameters rather than 136 M): ~358 M parameters in
    # its decoder layers. Generated from its seed when a benchmark asks; never committed.
    "qwen2-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
    },
}
_MARKER = "fairlane_preset.json"


def preset_matmul_params(config: dict[str, Any]) -> int:
    """The weights a token multiplies through in one forward pass (every decoder layer's
    projections and the LM head; embeddings are a lookup): 2 FLOPs each per token."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q = config["num_attention_heads"] * head_dim
    kv = config["num_key_value_heads"] * head_dim
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    return config["num_hidden_layers"] * per_layer + hidden * config["vocab_size"]


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The config.json content of a preset; ``overrides`` change or add keys (tests use them)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    shape = {**PRESETS[name], **overrides}
    model_type = shape.pop("model_type", "llama")
    config = {
        "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": model_type,
        "vocab_size": PRESET_VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "pad_token_id": PRESET_SPECIAL_TOKENS.index("<pad>"),
        "bos_token_id": PRESET_SPECIAL_TOKENS.index("<s>"),
        "eos_token_id": PRESET_SPECIAL_TOKENS.index("</s>"),
        **shape,
    }
    config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    return config


def preset_create(name: str, path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Write preset ``name`` with weights drawn from ``seed`` into ``path`` (replacing it)."""
    return _create(name, Path(path), seed=seed, overrides=overrides, is_existing_kept=False)


def ensure_preset(name: str, root: str | Path = "var/models", *, seed: int = 0) -> Path:
    """Return ``root/<name>-seed<seed>``, creating it unless an identical preset is already there.

    Safe when several processes ask at once: each writes a private staging directory and the
    first to rename it into place wins; the others keep what is there.
    """
    path = Path(root) / f"{name}-seed{seed}"
    if _marker_read(path) == _marker(name, seed, {}):
        return path
    return _create(name, path, seed=seed, overrides={}, is_existing_kept=True)


def _create(
    name: str, path: Path, *, seed: int, overrides: dict[str, Any], is_existing_kept: bool
) -> Path:
    config = preset_config(name, **overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    marker = _marker(name, seed, overrides)
    try:
        _write_model(staging, config, seed)
        (staging / _MARKER).write_text(json.dumps(marker, sort_keys=True))
        try:
            os.rename(staging, path)  # atomic; fails if someone else got there first
        except OSError:
            if is_existing_kept and _marker_read(path) == marker:
                return path
            shutil.rmtree(path, ignore_errors=True)
            os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _marker(name: str, seed: int, overrides: dict[str, Any]) -> dict[str, Any]:
    return {"preset": name, "seed": seed, "overrides": overrides, "version": PRESET_FORMAT_VERSION}


def _marker_read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_model(path: Path, config: dict[str, Any], seed: int) -> None:
    model_files_write(path, config, _random_weights(config, seed))


def model_files_write(path: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """A Hugging Face-format directory: config, generation config, weights, byte tokenizer."""
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    byte_tokenizer_write(path, model_max_length=config["max_position_embeddings"])


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Weights under transformers' names, scaled so attention matters and logits are spread out.

    Projections use std 1/sqrt(fan_in), so every layer changes the residual stream (a model whose
    attention barely contributes would hide KV-cache bugs), and lm_head spreads logits by ~2 so
    greedy choices are not near-ties that float rounding could flip.
    """
    g = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    num_layers = config["num_hidden_layers"]
    has_qkv_bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).contiguous()

    def norm_weight() -> torch.Tensor:
        return 1.0 + normal(hidden, std=0.1)

    residual_std = 1.0 / math.sqrt(2 * num_layers)
    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden, std=1.0)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm_weight()
        weights[p + "post_attention_layernorm.weight"] = norm_weight()
        for name, rows in (
            ("q_proj", heads * head_dim),
            ("k_proj", kv_heads * head_dim),
            ("v_proj", kv_heads * head_dim),
        ):
            weights[p + f"self_attn.{name}.weight"] = normal(rows, hidden, std=hidden**-0.5)
            if has_qkv_bias:
                weights[p + f"self_attn.{name}.bias"] = normal(rows, std=0.1)
        weights[p + "self_attn.o_proj.weight"] = normal(
            hidden, heads * head_dim, std=(heads * head_dim) ** -0.5 * residual_std
        )
        weights[p + "mlp.gate_proj.weight"] = normal(inter, hidden, std=hidden**-0.5)
        weights[p + "mlp.up_proj.weight"] = normal(inter, hidden, std=hidden**-0.5)
        weights[p + "mlp.down_proj.weight"] = normal(hidden, inter, std=inter**-0.5 * residual_std)
    weights["model.norm.weight"] = norm_weight()
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden, std=2.0 * hidden**-0.5)
    return weights
