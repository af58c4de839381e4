"""Presets: deterministic, offline, an ordinary Hugging Face directory with a byte tokenizer."""

from __future__ import annotations

import hashlib
import json

from workers.engine import PRESETS, Tokenizer, ensure_preset, preset_create


def _digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    a = preset_create("tiny", tmp_path / "a", seed=11)
    b = preset_create("tiny", tmp_path / "b", seed=11)
    c = preset_create("tiny", tmp_path / "c", seed=12)
    assert _digest(a) == _digest(b) != _digest(c)


def test_ensure_preset_reuses_an_existing_directory(tmp_path):
    first = ensure_preset("tiny", tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_preset("tiny", tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert {p.name for p in first.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_small_preset_is_in_the_benchmark_size_range():
    from workers.engine.presets import preset_config

    c = preset_config("small")
    per_layer = (
        c["hidden_size"]
        * c["head_dim"]
        * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
        + 3 * c["hidden_size"] * c["intermediate_size"]
    )
    total = per_layer * c["num_hidden_layers"] + 2 * c["vocab_size"] * c["hidden_size"]
    assert 20e6 <= total <= 50e6
    assert set(PRESETS) >= {"tiny", "small"}


def test_byte_tokenizer_round_trips_any_text_and_has_a_chat_template(tiny_dir):
    tok = Tokenizer(tiny_dir)
    text = "Grüße, 世界! \n\t<tag> 🙂"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode("<|im_end|>") == [4]
    assert tok.eos_token_id == json.loads((tiny_dir / "config.json").read_text())["eos_token_id"]


def test_hf_tokenizer_reads_the_same_files(tiny_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_dir)
    text = "héllo <|im_start|>x"
    assert hf(text, add_special_tokens=True)["input_ids"] == Tokenizer(tiny_dir).encode(text)


def test_concurrent_ensure_preset_calls_agree(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: ensure_preset("tiny", tmp_path, seed=5), range(4)))
    assert len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [
        "tiny-seed5"
    ]  # no staging directory left behind
    assert _digest(paths[0]) == _digest(preset_create("tiny", tmp_path / "again", seed=5))
