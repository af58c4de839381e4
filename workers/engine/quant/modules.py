"""Which layers are quantized, and swapping them in a loaded (or meta) model."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from workers.engine.model.llama import LlamaModel
from workers.engine.model.packed import PackedLinear
from workers.engine.quant.linear import QuantLinear

QUANTIZED_MODULES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
BITS = {"int8": 8, "int4": 4}


def _targets(model: LlamaModel) -> Iterator[tuple[str, nn.Module, str]]:
    for i, layer in enumerate(model.layers):
        for path in QUANTIZED_MODULES:
            parent_name, child = path.split(".")
            parent = getattr(layer, parent_name)
            yield f"layers.{i}.{path}", parent, child


def quantize_model(
    model: LlamaModel, method: str, *, group_size: int, is_prepared: bool = True
) -> dict[str, str]:
    """Quantize the decoder's linear layers in place; returns each layer's kernel.

    ``is_prepared=False`` keeps the portable form only (to save it), without probing kernels."""
    kernels = {}
    for name, parent, child in _targets(model):
        layer = getattr(parent, child)
        if isinstance(layer, QuantLinear):
            raise ValueError(f"{name} is already quantized")
        quantized = QuantLinear.from_linear(
            layer, bits=BITS[method], group_size=group_size, is_prepared=is_prepared
        )
        setattr(parent, child, quantized)
        kernels[name] = quantized.kernel
    return kernels


def quantized_shells(model: LlamaModel, method: str, *, group_size: int) -> None:
    """Replace the (meta) linear layers by empty QuantLinear ones, for a quantized checkpoint to
    fill."""
    for _, parent, child in _targets(model):
        layer = getattr(parent, child)
        setattr(
            parent,
            child,
            QuantLinear(
                layer.in_features,
                layer.out_features,
                bits=BITS[method],
                group_size=group_size,
                has_bias=layer.bias is not None,
            ),
        )


def quantized_prepare(model: LlamaModel) -> None:
    """After loading onto the device: probe each layer's kernel."""
    for _, parent, child in _targets(model):
        getattr(parent, child).prepare()


def model_weight_bytes(model: LlamaModel) -> dict[str, int]:
    """Bytes of the quantizable linear layers, and of every weight the model holds."""
    linear = other = 0
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, PackedLinear):
            linear += module.weight_packed.numel() * module.weight_packed.element_size()
        if isinstance(module, QuantLinear):
            linear += module.weight_bytes()
            seen.update(id(t) for t in module.buffers())
            if module.bias is not None:
                other += module.bias.numel() * module.bias.element_size()
                seen.add(id(module.bias))
    targets = {
        id(getattr(parent, child).weight)
        for _, parent, child in _targets(model)
        if isinstance(getattr(parent, child), nn.Linear)
    }
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        size = p.numel() * p.element_size()
        if id(p) in targets:
            linear += size
        else:
            other += size
    return {"linear_bytes": linear, "total_bytes": linear + other}
