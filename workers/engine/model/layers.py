"""Building blocks of a LLaMA decoder, written to match transformers' arithmetic exactly."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from workers.engine.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel; same arithmetic as the reference below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once the way transformers computes them."""

    cos: torch.Tensor  # buffers (nn.Module types those as Tensor | Module)
    signed_sin: torch.Tensor

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        half = emb.shape[-1] // 2
        sin = emb.sin()
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2): the sign lives in the table.
        signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("signed_sin", signed_sin, persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, 1, head_dim], broadcast over heads
        return self.cos[positions].to(dtype)[:, None, :], self.signed_sin[positions].to(dtype)[
            :, None, :
        ]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = dict(config.rope_scaling)
    if config.rope_type == "linear":
        return inv_freq / scaling["factor"]
    if config.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; x * cos + rotate_half(x) * sin, in three kernels."""
    half = x.shape[-1] // 2
    rotated = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, rotated, signed_sin)


class MLP(nn.Module):
    """SwiGLU with gate and up projections fused into one matrix multiply."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)
