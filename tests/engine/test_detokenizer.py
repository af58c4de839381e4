"""Streaming text never shows a broken character: split UTF-8 characters wait for their last
byte."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from workers.engine import SamplingParams, Tokenizer
from workers.engine.detokenizer import IncrementalDetokenizer
from workers.engine.params import SamplingParams as Params
from workers.engine.sequence import Sequence
from workers.engine.stopping import stop_check, text_delta, text_update

FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Tokenizer:
    return Tokenizer(tiny_dir)


def _byte_ids(tokenizer: Tokenizer, data: bytes) -> list[int]:
    """The preset's byte tokens for raw bytes (which need not be valid UTF-8)."""
    table = tokenizer.token_bytes_table()
    by_byte = {value: i for i, value in enumerate(table) if len(value) == 1}
    return [by_byte[bytes([b])] for b in data]


def _feed(tokenizer: Tokenizer, ids: list[int], *, is_finished: bool = True) -> list[str]:
    """Deltas when ``ids`` arrive one at a time after a one-token prompt."""
    prompt = tokenizer.encode("P")
    detok = IncrementalDetokenizer(tokenizer, prompt)
    seen = list(prompt)
    deltas = []
    for i, token in enumerate(ids):
        seen.append(token)
        deltas.append(detok.step(seen, is_last=is_finished and i == len(ids) - 1))
    return deltas


@pytest.mark.parametrize("char", ["é", "中", "😀"])
def test_a_split_character_is_held_back_until_its_last_byte(tokenizer, char):
    ids = tokenizer.encode(char)
    assert len(ids) == len(char.encode()) > 1  # one token per byte
    assert _feed(tokenizer, ids) == [""] * (len(ids) - 1) + [char]


def test_mixed_text_streams_whole_characters_only(tokenizer):
    text = "aé中😀b naïve – ok"
    deltas = _feed(tokenizer, tokenizer.encode(text))
    assert "".join(deltas) == text
    assert all(FFFD not in d for d in deltas)


def test_a_byte_that_can_never_complete_shows_at_once(tokenizer):
    # A lone continuation byte is invalid the moment it arrives; a lead byte cut off by "A" too.
    assert _feed(tokenizer, _byte_ids(tokenizer, b"\x80"), is_finished=False) == [FFFD]
    assert _feed(tokenizer, _byte_ids(tokenizer, b"\xe4\xb8A"), is_finished=False) == [
        "",
        "",
        FFFD + "A",
    ]


def test_an_unfinished_character_becomes_fffd_only_at_the_end(tokenizer):
    ids = _byte_ids(tokenizer, b"ok\xf0\x9f\x98")
    assert "".join(_feed(tokenizer, ids, is_finished=False)) == "ok"
    assert "".join(_feed(tokenizer, ids, is_finished=True)) == "ok" + FFFD


def test_deltas_equal_decoding_the_whole_output_for_random_bytes(tokenizer):
    rng = random.Random(0)
    for _ in range(200):
        data = bytes(
            rng.choice([rng.randrange(256), rng.randrange(0x80, 0x100)])
            for _ in range(rng.randint(1, 24))
        )
        ids = _byte_ids(tokenizer, data)
        assert (
            "".join(_feed(tokenizer, ids))
            == tokenizer.decode(ids)
            == data.decode("utf-8", errors="replace")
        )


def test_special_tokens_render_as_nothing(tokenizer):
    ids = tokenizer.encode("中", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    mixed = [ids[0], eos, *ids[1:]]
    assert _feed(tokenizer, mixed) == ["", "", "", "中"] and tokenizer.decode(mixed) == "中"


def test_stop_string_across_split_characters(tiny_dir, tokenizer):
    """The engine's per-token path: stop on "中!" whose bytes arrive one per step; nothing
    half-sent."""
    params = Params(max_tokens=64, stop=["中!"])
    prompt = tokenizer.encode("Q")
    seq = Sequence("r", prompt, params, tenant="t", lane="standard", salt="t", arrival_time=0.0)
    seq.detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    streamed, reason = [], None
    for token in tokenizer.encode("é😀中中!tail"):
        seq.token_ids.append(token)
        reason = text_update(seq, stop_check(seq, token, (), 1024))
        streamed.append(text_delta(seq, is_finished=reason is not None))
        if reason is not None:
            break
    assert seq.stop_reason == "中!" and seq.text == "é😀中"
    assert "".join(streamed) == "é😀中" and all(FFFD not in d for d in streamed)


def test_engine_stream_equals_decoding_its_tokens(make_engine, prompts):
    """Random weights emit arbitrary bytes; streamed deltas still add up to the decoded output."""
    engine = make_engine()
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts[:8]]
    text = dict.fromkeys(ids, "")
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            text[out.request_id] += out.new_text
            tokens[out.request_id] += out.new_token_ids
    for rid in ids:
        assert text[rid] == engine.tokenizer.decode(tokens[rid])


def test_other_tokenizers_fall_back_to_windowed_decoding(tmp_path):
    """SentencePiece-style byte fallback (<0xE4>): no byte table, same holding back."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({"a": 256, "b": 257})
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    hf.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    tok = Tokenizer(tmp_path)
    assert tok.token_bytes_table() is None
    ids = [256, 0xE4, 0xB8, 0xAD, 257]
    detok = IncrementalDetokenizer(tok, [256])
    deltas = [detok.step([256, *ids[: i + 1]]) for i in range(len(ids))]
    assert deltas == ["a", "", "", "中", "b"]
