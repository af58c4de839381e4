"""Load a Hugging Face-format directory (config.json + *.safetensors) into LlamaModel."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from workers.engine.config import ModelConfig
from workers.engine.errors import UnsupportedModel
from workers.engine.model.layers import RotaryEmbedding
from workers.engine.model.llama import LlamaModel
from workers.engine.quant.checkpoint import quantization_config_read
from workers.engine.quant.modules import quantized_prepare, quantized_shells

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def resolve_dtype(name: str, config: ModelConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return _DTYPES.get(config.torch_dtype, torch.bfloat16)


def model_load(
    path: str | Path, *, device: torch.device, dtype: torch.dtype, max_positions: int
) -> LlamaModel:
    """The model at ``path``; a quantized checkpoint (see workers.engine.quant) loads quantized."""
    path = Path(path)
    config = ModelConfig.from_dir(path)
    quantization = quantization_config_read(json.loads((path / "config.json").read_text()))
    tensors = _read_safetensors(path)
    with torch.device("meta"):  # no time spent drawing random weights that are overwritten anyway
        model = LlamaModel(
            config,
            max_positions=max_positions,
            has_qkv_bias=any(
                name.startswith("layers.0.self_attn.") and name.endswith("_proj.bias")
                for name in tensors
            ),
            has_qk_norm="layers.0.self_attn.q_norm.weight" in tensors,
        )
    if quantization is not None:
        quantized_shells(model, quantization[0], group_size=quantization[1])
    state = _to_engine_names(tensors, config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise UnsupportedModel(
            f"checkpoint does not match the architecture: missing {missing[:5]}, unexpected"
            f" {unexpected[:5]}"
        )
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary = RotaryEmbedding(config, max_positions)  # its tables are computed, not loaded
    model = model.to(device=device, dtype=dtype).eval()
    if quantization is not None:
        quantized_prepare(model)
    return model


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"no *.safetensors in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping: keys() only)
                tensors[name.removeprefix("model.")] = f.get_tensor(name)
    return tensors


def _to_engine_names(
    tensors: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Fuse q/k/v and gate/up projections; everything else keeps transformers' name."""
    state: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _LAYER.match(name)
        if match is None:
            state[name] = tensor
            continue
        layer, rest = match.groups()
        part = rest.split(".")[-2] if rest.count(".") >= 1 else rest
        kind = rest.rsplit(".", 1)[-1]  # weight / bias
        if part in ("q_proj", "k_proj", "v_proj"):
            fused.setdefault(f"layers.{layer}.self_attn.qkv_proj.{kind}", {})[part] = tensor
        elif part in ("gate_proj", "up_proj"):
            fused.setdefault(f"layers.{layer}.mlp.gate_up_proj.{kind}", {})[part] = tensor
        elif "rotary_emb" not in rest:
            state[name] = tensor
    for name, parts in fused.items():
        order = ("q_proj", "k_proj", "v_proj") if "qkv" in name else ("gate_proj", "up_proj")
        if any(p not in parts for p in order):
            raise UnsupportedModel(f"{name}: checkpoint lacks one of {order}")
        state[name] = torch.cat([parts[p] for p in order], dim=0)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state
