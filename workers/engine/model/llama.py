"""The LLaMA-family decoder (LLaMA, Mistral, Qwen2/3) over a paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from workers.engine.config import ModelConfig
from workers.engine.model.attention import (
    AttentionMetadata,
    GatherWorkspace,
    kv_write,
    paged_attention,
)
from workers.engine.model.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, *, has_qkv_bias: bool, has_qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=has_qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if has_qk_norm else None

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata, workspace: GatherWorkspace):
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        # Queries and keys are rotated together: [T, num_heads + kv_heads, head_dim]
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither
            qk = torch.cat(
                (self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), dim=1
            )
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        k_cache, v_cache = kv_cache
        kv_write(k_cache, v_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, workspace)
        return self.o_proj(o.view(num_tokens, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, **attention_kwargs: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, **attention_kwargs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, kv_cache, meta, workspace):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta, workspace)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Token ids in, final-norm hidden states out; logits only for the rows that sample."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_positions: int,
        has_qkv_bias: bool = False,
        has_qk_norm: bool = False,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, has_qkv_bias=has_qkv_bias, has_qk_norm=has_qk_norm)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config, max_positions)
        self.workspace = GatherWorkspace()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=False):
            x = layer(x, cos, sin, kv_cache, meta, self.workspace)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # [rows, vocab]
