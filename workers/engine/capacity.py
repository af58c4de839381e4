"""How long a sequence the engine serves, decided once: the KV pool's blocks and the model's
context. The engine sizes itself with these, and the model registry publishes the same figure,
so the API checks a request against the context the engine will enforce."""

from __future__ import annotations

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.loader import resolve_dtype
from workers.engine.spec.draft import draft_kv_bytes_per_block


def kv_pool_blocks(config: EngineConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """The pool's blocks: ``num_kv_blocks``, or as many as ``kv_cache_memory_bytes`` holds."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    itemsize = torch.empty(0, dtype=dtype).element_size()
    per_block = (
        model.num_hidden_layers
        * 2
        * model.num_key_value_heads
        * config.block_size
        * model.head_dim
        * itemsize
    )
    per_block += speculation_kv_bytes_per_block(config, dtype)  # a draft's K/V share the blocks
    return max(config.kv_cache_memory_bytes // per_block, 2)


def speculation_kv_bytes_per_block(config: EngineConfig, dtype: torch.dtype) -> int:
    """KV bytes a block needs for the draft model too (0 without one)."""
    spec = config.speculative
    if spec is None or spec.method != "draft":
        return 0
    return draft_kv_bytes_per_block(spec.draft_model, config.block_size, dtype)


def max_model_len(config: EngineConfig, model: ModelConfig, num_blocks: int) -> int:
    """The checkpoint's context, or ``config.max_model_len`` (ValueError where it asks for more
    than the checkpoint allows), and never more than one sequence can hold of the pool."""
    limit = model.context_length
    if config.max_model_len is not None:
        if config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {limit}")
        limit = config.max_model_len
    return min(limit, num_blocks * config.block_size)


def engine_context_length(config: EngineConfig) -> int:
    """The ``max_model_len`` of an engine built from ``config``, without loading its weights."""
    model = ModelConfig.from_dir(config.model)
    dtype = resolve_dtype(config.dtype, model, torch.device(config.device))
    return max_model_len(config, model, kv_pool_blocks(config, model, dtype))
