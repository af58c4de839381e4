"""JSON mode in the engine (llguidance): a guide allows exactly the tokens that keep the output
a JSON object (prefixes while open), EOS only once it is closed; a guided sequence only ever
picks such tokens."""

from __future__ import annotations

import json

import pytest
import torch

from tests.engine.guide_helpers import accepts, byte_ids, follows, guide_for, random_walk
from workers.engine import SamplingParams
from workers.engine import guide as guide_module
from workers.engine.errors import InvalidRequest
from workers.engine.guide import guide_masks, guide_start
from workers.engine.sampler import Sampler
from workers.engine.sequence import Sequence
from workers.engine.tokenizer import Tokenizer

DOCS = [
    {},
    {"a": 1},
    {"a": [1, -2.5, 3e10, -0.0, 1e-3, True, False, None, "x"], "b": {}},
    {"nested": {"deeper": [[], [{}], {"k": "v"}]}},
    {"é": "日本", "esc": '"\\/\b\f\n\r\t'},
    {"emoji": "\U0001f600", "u": "\u0001"},
]
COMPACT = {"separators": (",", ":")}


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_every_json_object_is_accepted_and_may_end_only_once_closed(tokenizer, doc, ensure_ascii):
    data = json.dumps(doc, ensure_ascii=ensure_ascii, **COMPACT).encode()
    assert accepts(tokenizer, data)
    guide, eos = guide_for(tokenizer), tokenizer.eos_token_id
    for token_id in byte_ids(tokenizer, data)[:-1]:  # every prefix is open: no EOS yet
        assert follows(guide, [token_id]) and not guide.allowed()[eos]
        assert not guide.is_complete


@pytest.mark.parametrize(
    "data",
    [
        b"[1]",
        b'"x"',
        b"1",
        b"{,}",
        b'{"a" 1}',
        b'{"a":01}',
        b'{"a":tru}',
        b'{"a":1,}',
        b'{"a":1}x',
        b'{"a":1}}',
        b'{"a":-}',
        b'{"a":1.}',
        b'{"a":1e}',
        b'{"a":"\x01"}',
        b'{"a":"\xff"}',
        b'{"a":"\xc3("}',
        b'{"a":"\xe0\x99\xa7"}',
        b'{"a":"\xed\xa0\x80"}',
        b'{"a":"\\x"}',
        b'{"a":"\\u12g4"}',
        b"{a:1}",
        b"{ }",
        b'{"a": 1}',
        b'{"a":1, "b":2}',
        b"{" * 40,
    ],
)
def test_anything_else_is_refused(tokenizer, data):
    assert not accepts(tokenizer, data)


@pytest.mark.parametrize("indent", [None, 2])
def test_the_json_is_compact_blanks_between_tokens_are_refused(tokenizer, indent):
    # A random model spends its max_tokens on blanks where the grammar allows them, and the
    # document (a tool call) never ends: compact JSON only, as json.dumps(separators=(",", ":")).
    doc = {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}
    assert not accepts(tokenizer, json.dumps(doc, indent=indent).encode())
    assert accepts(tokenizer, json.dumps(doc, **COMPACT).encode())
    guide = guide_for(tokenizer)
    assert follows(guide, byte_ids(tokenizer, b'{"a":'))
    assert not guide.allowed()[byte_ids(tokenizer, b" \t\n\r")].any()


def test_special_tokens_are_never_allowed_and_eos_only_at_the_end(tokenizer):
    guide, eos = guide_for(tokenizer), tokenizer.eos_token_id
    special = [
        tokenizer.encode(t, add_special_tokens=False)[0]
        for t in ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
    ]
    assert guide.allowed().nonzero().flatten().tolist() == byte_ids(tokenizer, b"{")
    assert follows(guide, byte_ids(tokenizer, b'{"a":"'))
    assert not guide.allowed()[special].any()
    assert follows(guide, byte_ids(tokenizer, b'x"}'))
    assert guide.allowed().nonzero().flatten().tolist() == [eos] and guide.is_complete


def test_random_walks_over_the_allowed_tokens_end_in_objects(tokenizer):
    closing = {b"}", b"]", b'"', b"0", b":", b"1"}
    for seed in range(40):
        out = random_walk(tokenizer, guide_for(tokenizer), seed, closing=closing)
        assert isinstance(json.loads(out), dict), out


def test_a_guided_engine_answers_a_json_object_prefix_and_ends_only_when_closed(
    make_engine, prompts, tokenizer
):
    engine = make_engine()
    params = [
        SamplingParams(max_tokens=48, temperature=1.0, seed=s, guide="json_object", min_tokens=4)
        for s in range(6)
    ]
    for output in engine.generate(prompts[:6], params):
        guide = guide_for(tokenizer)
        data = tokenizer.decode(output.token_ids).encode()
        assert follows(
            guide, output.token_ids[:-1] if output.finish_reason == "stop" else output.token_ids
        ), data
        assert data.lstrip()[:1] == b"{", data
        if output.finish_reason == "stop":
            assert output.token_ids[-1] == tokenizer.eos_token_id and guide.is_complete
            assert isinstance(json.loads(data), dict)
        else:
            assert not guide.is_complete
    # Biased towards "{" and "}", greedy: the smallest object, then the end (min_tokens waived).
    brace_open, brace_close = (
        tokenizer.encode("{", add_special_tokens=False)[0],
        tokenizer.encode("}", add_special_tokens=False)[0],
    )
    [output] = engine.generate(
        [prompts[3]],
        SamplingParams(
            max_tokens=20,
            temperature=0.0,
            guide="json_object",
            min_tokens=10,
            logit_bias={brace_open: 100, brace_close: 100},
        ),
    )
    assert tokenizer.decode(output.token_ids) == "{}" and output.finish_reason == "stop"


def test_a_resumed_guided_request_goes_on_from_its_output(make_engine, prompts, tokenizer):
    done = tokenizer.encode('{"a":[1', add_special_tokens=False)
    [output] = make_engine().generate(
        [prompts[2] + done],
        SamplingParams(
            max_tokens=40, temperature=1.0, seed=3, guide="json_object", guide_prefix=done
        ),
    )
    ids = output.token_ids[:-1] if output.finish_reason == "stop" else output.token_ids
    assert follows(guide_for(tokenizer), done + ids)


def test_unknown_guides_are_refused():
    with pytest.raises(InvalidRequest):
        SamplingParams(guide="yaml")


def test_a_guide_broken_by_a_forced_token_leaves_the_sequence_unconstrained(tokenizer):
    guide = guide_for(tokenizer)
    guide.advance(byte_ids(tokenizer, b"x")[0])  # not JSON: e.g. a resumed request's output
    assert not guide.is_active and guide.allowed() is None


def test_the_sampler_keeps_only_allowed_tokens_even_past_the_tokenizers_ids(tokenizer):
    eos = (tokenizer.eos_token_id,)
    params = SamplingParams(temperature=0.0, guide="json_object")
    seq = Sequence("s", [5], params, tenant="t", lane="standard", salt="t", arrival_time=0.0)
    seq.guide = guide_start(tokenizer, eos, params)
    logits = torch.zeros(1, tokenizer.vocab_size + 7)  # a model may pad its vocabulary
    logits[0, -1], logits[0, 0], logits[0, 128] = 50.0, 40.0, 1.0  # padding, "<pad>", "{"
    assert Sampler(0)(logits, [seq], eos).token_ids == [128]


def test_the_sampler_masks_a_batch_of_guided_and_free_rows_each_by_its_own(tokenizer):
    eos = (tokenizer.eos_token_id,)
    guided = SamplingParams(temperature=0.0, guide="json_object")
    seqs = [
        Sequence(
            str(i),
            [5],
            guided if i % 2 else SamplingParams(temperature=0.0),
            tenant="t",
            lane="standard",
            salt="t",
            arrival_time=0.0,
        )
        for i in range(4)
    ]
    for seq in seqs[1::2]:
        seq.guide = guide_start(tokenizer, eos, guided)
    seqs[3].guide.advance(128)  # "{": a key or "}" next
    logits = torch.zeros(4, tokenizer.vocab_size)
    logits[:, 0] = 50.0  # "<pad>": what the free rows pick
    assert Sampler(0)(logits, seqs, eos).token_ids[:3] == [0, 128, 0]
    assert Sampler(0)(logits, seqs, eos).token_ids[3] in byte_ids(tokenizer, b'"} \n\t\r')


def test_the_grammar_decides_when_eos_comes_over_min_tokens_in_a_mixed_batch(tokenizer):
    eos = (tokenizer.eos_token_id,)
    guided = SamplingParams(temperature=0.0, guide="json_object", min_tokens=10)
    free = SamplingParams(temperature=0.0, min_tokens=10)
    seqs = [
        Sequence(str(i), [5], params, tenant="t", lane="standard", salt="t", arrival_time=0.0)
        for i, params in enumerate((free, guided, free))
    ]
    seqs[1].guide = guide_start(tokenizer, eos, guided)
    assert follows(seqs[1].guide, byte_ids(tokenizer, b"{}"))  # closed: only EOS may come
    logits = torch.zeros(3, tokenizer.vocab_size)
    logits[:, eos[0]], logits[:, 128] = 50.0, 40.0  # EOS, then "{"
    assert Sampler(0)(logits, seqs, eos).token_ids == [128, eos[0], 128]


def test_masks_filled_on_llguidances_threads_equal_those_filled_here(tokenizer, monkeypatch):
    """Large vocabularies' masks are filled in parallel; the presets' are too small for it."""
    guides = [guide_for(tokenizer) for _ in range(3)]
    for guide, text in zip(guides, (b"", b'{"a":', b'{"a":"x'), strict=False):
        assert follows(guide, byte_ids(tokenizer, text))
    here = guide_masks(guides, tokenizer.vocab_size + 3)
    monkeypatch.setattr(guide_module, "PARALLEL_MIN_TOKENS", 0)
    assert torch.equal(guide_masks(guides, tokenizer.vocab_size + 3), here)
    assert not here[:, tokenizer.vocab_size :].any()  # past the tokenizer's ids: never
    assert len({tuple(row.tolist()) for row in here}) == 3
