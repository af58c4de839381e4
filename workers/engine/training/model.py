"""A trainable LLaMA decoder with the engine's arithmetic, saved under transformers' names."""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from workers.engine.config import ModelConfig
from workers.engine.model.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope


class Block(nn.Module):
    def __init__(self, mc: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            mc.num_attention_heads,
            mc.num_key_value_heads,
            mc.head_dim,
        )
        self.input_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(mc.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, mc.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.mlp = MLP(mc)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape  # [B, T, hidden]
        qkv = self.qkv_proj(self.input_layernorm(x)).view(
            batch, length, self.heads + 2 * self.kv_heads, self.head_dim
        )
        qk = apply_rope(qkv[:, :, : self.heads + self.kv_heads], cos, sin)
        q, k = qk[:, :, : self.heads].transpose(1, 2), qk[:, :, self.heads :].transpose(1, 2)
        v = qkv[:, :, self.heads + self.kv_heads :].transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )  # [B, heads, T, head_dim]
        x = x + self.o_proj(o.transpose(1, 2).reshape(batch, length, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class TrainableLlama(nn.Module):
    def __init__(self, config: dict[str, Any], *, max_positions: int) -> None:
        super().__init__()
        self.config = config
        mc = ModelConfig.from_dict(config)
        self.embed_tokens = nn.Embedding(mc.vocab_size, mc.hidden_size)
        self.layers = nn.ModuleList(Block(mc) for _ in range(mc.num_hidden_layers))
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.lm_head = nn.Linear(mc.hidden_size, mc.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(mc, max_positions)
        self._init(mc.num_hidden_layers)

    @property
    def blocks(self) -> list[Block]:
        """The decoder blocks, as the Blocks ``__init__`` put there (nn.ModuleList yields
        nn.Module)."""
        return cast(list[Block], list(self.layers))

    def _init(self, num_layers: int) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norm weights stay 1
            std = (
                0.02 / math.sqrt(2 * num_layers)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else 0.02
            )
            nn.init.normal_(p, std=std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> logits [B, T, vocab]."""
        x = self.embed_tokens(ids)
        positions = torch.arange(ids.shape[1])
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) over windows ids [B, T + 1]."""
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under transformers' LlamaForCausalLM names (q/k/v and gate/up split)."""
        mc = ModelConfig.from_dict(self.config)
        q_size, kv_size = mc.num_attention_heads * mc.head_dim, mc.num_key_value_heads * mc.head_dim
        out = {
            "model.embed_tokens.weight": self.embed_tokens.weight,
            "model.norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.weight,
        }
        for i, layer in enumerate(self.blocks):
            p = f"model.layers.{i}."
            q, k, v = layer.qkv_proj.weight.split([q_size, kv_size, kv_size])
            gate, up = layer.mlp.gate_up_proj.weight.split(mc.intermediate_size)
            out.update(
                {
                    p + "input_layernorm.weight": layer.input_layernorm.weight,
                    p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
                    p + "self_attn.q_proj.weight": q,
                    p + "self_attn.k_proj.weight": k,
                    p + "self_attn.v_proj.weight": v,
                    p + "self_attn.o_proj.weight": layer.o_proj.weight,
                    p + "mlp.gate_proj.weight": gate,
                    p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": layer.mlp.down_proj.weight,
                }
            )
        return {name: t.detach().contiguous().clone() for name, t in out.items()}
