"""The context the model registry publishes (what the API checks a request against) is the one
the model's engine serves: one rule decides it for both, the KV pool and the sliding window
included."""

import pytest

from workers.engine import LLMEngine, preset_create
from workers.serving.catalog import ModelInfo, model_context_length, model_engine_config


def served(info: ModelInfo) -> int:
    return LLMEngine(model_engine_config(info)).max_model_len


def test_a_window_the_attention_does_not_use_leaves_the_context_whole(tmp_path):
    path = preset_create("tiny", tmp_path / "m", sliding_window=256, use_sliding_window=False)
    info = ModelInfo(name="m", source=str(path))
    assert model_context_length(info) == served(info) == 1024


def test_a_kv_pool_shorter_than_the_checkpoint_caps_the_context(settings, tmp_path):
    settings.FAIRLANE_ENGINE_KV_CACHE_MB = 1  # tiny: 8 KiB a block, so 128 blocks of 16
    path = preset_create("tiny", tmp_path / "m", max_position_embeddings=4096)
    info = ModelInfo(name="m", source=str(path))
    assert model_context_length(info) == served(info) == 2048


def test_a_cap_beyond_the_checkpoint_fails_the_engine_not_the_request(settings, tmp_path):
    settings.FAIRLANE_MAX_MODEL_LEN = 4096
    info = ModelInfo(name="m", source=str(preset_create("tiny", tmp_path / "m")))
    with pytest.raises(ValueError, match="exceeds the model's 1024"):
        served(info)
    assert model_context_length(info) == 1024


@pytest.mark.parametrize(("cap", "context"), [(None, 1024), (512, 512)])
def test_vllm_is_started_with_the_checkpoints_context_under_the_cap(
    settings, tmp_path, cap, context
):
    settings.FAIRLANE_MAX_MODEL_LEN = cap
    path = preset_create("tiny", tmp_path / "m", sliding_window=256, use_sliding_window=False)
    assert model_context_length(ModelInfo(name="m", source=str(path), runtime="vllm")) == context
