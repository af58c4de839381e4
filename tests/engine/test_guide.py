"""JSON mode in the engine: the byte automaton accepts exactly JSON objects (prefixes while
open), a guided sequence only ever picks tokens that keep its output such a prefix, and it
may end only once the object is closed."""

from __future__ import annotations

import json
import random

import pytest
import torch

from workers.engine import SamplingParams
from workers.engine.errors import InvalidRequest
from workers.engine.guide import DONE, MAX_BLANKS, START, GuideState, JsonGuide, json_step
from workers.engine.sampler import Sampler
from workers.engine.sequence import Sequence
from workers.engine.tokenizer import Tokenizer

DOCS = [{}, {"a": 1}, {"a": [1, -2.5, 3e10, -0.0, 1E-3, True, False, None, "x"], "b": {}},
        {"nested": {"deeper": [[], [{}], {"k": "v"}]}}, {"é": "日本", "esc": "\"\\/\b\f\n\r\t"},
        {"emoji": "\U0001F600", "u": "\u0001"}]


def run(data: bytes):
    state = START
    for byte in data:
        state = json_step(state, byte)
        if state is None:
            return None
    return state


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("indent", [None, 2])
def test_every_json_object_is_accepted_and_ends_done(doc, indent):
    data = json.dumps(doc, indent=indent, ensure_ascii=indent is None).encode()
    state = run(data)
    assert state is not None and state[1] == DONE
    for cut in range(len(data)):  # every prefix is open, not done
        prefix = run(data[:cut])
        assert prefix is not None and prefix[1] != DONE


@pytest.mark.parametrize("data", [
    b"[1]", b'"x"', b"1", b"{,}", b'{"a" 1}', b'{"a":01}', b'{"a":tru}', b'{"a":1,}',
    b'{"a":1}x', b'{"a":1}}', b'{"a":-}', b'{"a":1.}', b'{"a":1e}', b'{"a":"\x01"}',
    b'{"a":"\xff"}', b'{"a":"\xc3("}', b'{"a":"\xe0\x99\xa7"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\\x"}', b'{"a":"\\u12g4"}', b"{a:1}",
    b"{" + b" " * (MAX_BLANKS + 1), b"{" * 40,
])
def test_anything_else_is_refused(data):
    assert run(data) is None or run(data)[1] != DONE and run(data + b"}" * 40) is None


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


def test_allowed_tokens_keep_the_output_a_prefix_and_walks_close(tokenizer):
    table = tokenizer.token_bytes_table()
    eos = (tokenizer.eos_token_id,)
    guide = JsonGuide(table, eos)
    closing = {b"}", b"]", b'"', b"0", b":", b"1"}
    for seed in range(40):
        rng, state, out = random.Random(seed), START, b""
        for _ in range(2000):
            allowed = guide.allowed_ids(state)
            assert allowed, out
            if state[1] == DONE:
                assert allowed == list(eos)
                break
            preferred = [t for t in allowed if table[t] in closing]
            token = rng.choice(preferred if preferred and rng.random() < 0.6 else allowed)
            state = guide.advance(state, table[token])
            assert state is not None
            out += table[token]
        assert isinstance(json.loads(out), dict), out


def test_a_guided_engine_answers_a_json_object_prefix_and_ends_only_when_closed(make_engine, prompts, tokenizer):
    engine = make_engine()
    params = [SamplingParams(max_tokens=48, temperature=1.0, seed=s, guide="json_object", min_tokens=4)
              for s in range(6)]
    for output in engine.generate(prompts[:6], params):
        data = tokenizer.decode(output.token_ids).encode()
        state = run(data)
        assert state is not None and data.lstrip()[:1] == b"{", data
        assert (output.finish_reason == "stop") == (state[1] == DONE)
        if output.finish_reason == "stop":
            assert isinstance(json.loads(data), dict)
    # Biased towards "{" and "}", greedy: the smallest object, then the end (min_tokens waived).
    brace_open, brace_close = tokenizer.encode("{", add_special_tokens=False)[0], tokenizer.encode("}", add_special_tokens=False)[0]
    [output] = engine.generate([prompts[3]], SamplingParams(
        max_tokens=20, temperature=0.0, guide="json_object", min_tokens=10,
        logit_bias={brace_open: 100, brace_close: 100}))
    assert tokenizer.decode(output.token_ids) == "{}" and output.finish_reason == "stop"


def test_a_resumed_guided_request_goes_on_from_its_output(make_engine, prompts, tokenizer):
    done = tokenizer.encode('{"a": [1', add_special_tokens=False)
    [output] = make_engine().generate([prompts[2] + done], SamplingParams(
        max_tokens=40, temperature=1.0, seed=3, guide="json_object", guide_prefix=done))
    assert run(tokenizer.decode(done + output.token_ids).encode()) is not None


def test_unknown_guides_are_refused():
    with pytest.raises(InvalidRequest):
        SamplingParams(guide="yaml")


def test_the_sampler_keeps_only_allowed_tokens_even_past_the_tokenizers_ids(tokenizer):
    table, eos = tokenizer.token_bytes_table(), (tokenizer.eos_token_id,)
    seq = Sequence("s", [5], SamplingParams(temperature=0.0, guide="json_object"), tenant="t",
                   lane="standard", salt="t", arrival_time=0.0)
    seq.guide = GuideState(JsonGuide(table, eos), table)
    logits = torch.zeros(1, len(table) + 7)  # a model may pad its vocabulary past the tokenizer's
    logits[0, -1], logits[0, 0], logits[0, 128] = 50.0, 40.0, 1.0  # padding, "<pad>", "{"
    assert Sampler(0)(logits, [seq], eos).token_ids == [128]
