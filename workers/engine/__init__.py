"""Fairlane's inference engine: a paged-KV, continuous-batching LLaMA-family engine in PyTorch.

Plain PyTorch; nothing here imports Django or another app of the repository.
"""

from workers.engine.async_engine import AsyncEngine
from workers.engine.capacity import engine_context_length
from workers.engine.config import (
    EngineConfig,
    ModelConfig,
    SpeculativeConfig,
    checkpoint_context_length,
)
from workers.engine.engine import LLMEngine
from workers.engine.errors import (
    ContextLengthExceeded,
    EngineError,
    EngineStopped,
    InvalidRequest,
    OutOfBlocks,
    UnsupportedModel,
)
from workers.engine.outputs import Completion, RequestOutput
from workers.engine.params import SamplingParams
from workers.engine.policy import FairSharePolicy, FifoPolicy, KeyPolicy, SchedulingPolicy
from workers.engine.presets import PRESETS, ensure_preset, preset_create
from workers.engine.sequence import FinishReason
from workers.engine.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "AsyncEngine",
    "Completion",
    "ContextLengthExceeded",
    "EngineConfig",
    "EngineError",
    "EngineStopped",
    "FairSharePolicy",
    "FinishReason",
    "FifoPolicy",
    "InvalidRequest",
    "KeyPolicy",
    "LLMEngine",
    "ModelConfig",
    "OutOfBlocks",
    "RequestOutput",
    "SamplingParams",
    "SchedulingPolicy",
    "SpeculativeConfig",
    "Tokenizer",
    "UnsupportedModel",
    "checkpoint_context_length",
    "engine_context_length",
    "ensure_preset",
    "preset_create",
]
