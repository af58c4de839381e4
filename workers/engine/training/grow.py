"""Grow a trained small model into a wider, deeper one that computes the same function.

Compute on 2 cores buys the 25 M-parameter target only ~10^5 training tokens, fewer than its
1.7 M-parameter draft sees in the same time; so the target starts as the trained draft, grown
without changing its output (the Net2Net idea), and trains on from there.

The draft's hidden dimensions are the target's first ones; the rest of the residual stream is
zero and stays zero because every weight that *writes* into it (o_proj, down_proj rows) or that
writes from a new unit (new heads' o_proj columns, new MLP units' down_proj columns) starts at
zero, while weights that *read* (q/k/v, gate/up, lm_head columns) start small and random, so
gradients reach everything. RMSNorm over twice the width sees a root-mean-square 1/sqrt(r)
as large, so norm weights are scaled by 1/sqrt(r). Layers that are new are identities.
"""

from __future__ import annotations

import math

import torch

from workers.engine.config import ModelConfig
from workers.engine.training.model import Block, TrainableLlama

READ_STD = 0.02


@torch.no_grad()
def grow(small: TrainableLlama, big: TrainableLlama, *, generator: torch.Generator) -> None:
    """Overwrite ``big``'s weights so that it computes exactly what ``small`` computes."""
    s, b = ModelConfig.from_dict(small.config), ModelConfig.from_dict(big.config)
    _check(s, b)
    h = s.hidden_size
    norm_scale = math.sqrt(h / b.hidden_size)

    def small_random(t: torch.Tensor) -> None:
        t.copy_(torch.randn(t.shape, generator=generator) * READ_STD)

    big.embed_tokens.weight.zero_()[:, :h] = small.embed_tokens.weight
    big.norm.weight.fill_(norm_scale)[:h] = small.norm.weight * norm_scale
    small_random(big.lm_head.weight)
    big.lm_head.weight[:, :h] = small.lm_head.weight
    placement = _placement(s.num_hidden_layers, b.num_hidden_layers)
    for i, layer in enumerate(big.blocks):
        _layer_init(layer, small_random, norm_scale)
        if i in placement:
            _layer_copy(small.blocks[placement[i]], layer, s, b, norm_scale)


def _check(s: ModelConfig, b: ModelConfig) -> None:
    if (s.head_dim, s.num_key_value_heads, s.vocab_size, s.rope_theta) != (
        b.head_dim,
        b.num_key_value_heads,
        b.vocab_size,
        b.rope_theta,
    ):
        raise ValueError("growing needs the same head size, KV heads, vocabulary and RoPE")
    if (
        s.hidden_size > b.hidden_size
        or s.intermediate_size > b.intermediate_size
        or s.num_hidden_layers > b.num_hidden_layers
    ):
        raise ValueError("the grown model must be at least as large in every dimension")
    if b.num_queries_per_kv < s.num_queries_per_kv:
        raise ValueError("the grown model needs at least as many query heads per KV head")


def _placement(num_small: int, num_big: int) -> dict[int, int]:
    """Big layer index -> small layer copied there; spread out, first and last kept at the ends."""
    if num_small == 1:
        return {0: 0}
    return {round(i * (num_big - 1) / (num_small - 1)): i for i in range(num_small)}


def _layer_init(layer: Block, small_random, norm_scale: float) -> None:
    """An identity block: it reads (random), writes nothing (zero)."""
    layer.input_layernorm.weight.fill_(norm_scale)
    layer.post_attention_layernorm.weight.fill_(norm_scale)
    small_random(layer.qkv_proj.weight)
    layer.o_proj.weight.zero_()
    small_random(layer.mlp.gate_up_proj.weight)
    layer.mlp.down_proj.weight.zero_()


def _layer_copy(src: Block, dst: Block, s: ModelConfig, b: ModelConfig, norm_scale: float) -> None:
    h, d = s.hidden_size, s.head_dim
    dst.input_layernorm.weight[:h] = src.input_layernorm.weight * norm_scale
    dst.post_attention_layernorm.weight[:h] = src.post_attention_layernorm.weight * norm_scale
    sq, bq = s.num_attention_heads * d, b.num_attention_heads * d
    kv = s.num_key_value_heads * d
    for head in range(s.num_attention_heads):  # keep each head with its KV group
        group, index = divmod(head, s.num_queries_per_kv)
        target = group * b.num_queries_per_kv + index
        dst.qkv_proj.weight[target * d : (target + 1) * d, :h] = src.qkv_proj.weight[
            head * d : (head + 1) * d
        ]
        dst.o_proj.weight[:h, target * d : (target + 1) * d] = src.o_proj.weight[
            :, head * d : (head + 1) * d
        ]
    dst.qkv_proj.weight[bq : bq + 2 * kv, :h] = src.qkv_proj.weight[sq : sq + 2 * kv]
    si, bi = s.intermediate_size, b.intermediate_size
    dst.mlp.gate_up_proj.weight[:si, :h] = src.mlp.gate_up_proj.weight[:si]
    dst.mlp.gate_up_proj.weight[bi : bi + si, :h] = src.mlp.gate_up_proj.weight[si:]
    dst.mlp.down_proj.weight[:h, :si] = src.mlp.down_proj.weight
