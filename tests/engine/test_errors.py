"""Bad input raises a typed error with the offending parameter; everyone else keeps being served."""

from __future__ import annotations

import pytest

from workers.engine import (
    ContextLengthExceeded,
    EngineConfig,
    FairSharePolicy,
    InvalidRequest,
    SamplingParams,
)

GOOD = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 1000.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"seed": 2**64}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_out_of_range_sampling_parameters_are_refused(kwargs, param):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param and info.value.code == "invalid_request"


@pytest.mark.parametrize(
    ("prompt", "kwargs", "error", "param"),
    [
        ("", {}, InvalidRequest, "prompt"),
        ([], {}, InvalidRequest, "prompt"),
        ([5, 999], {}, InvalidRequest, "prompt"),
        ([5, -1], {}, InvalidRequest, "prompt"),
        (None, {}, InvalidRequest, "prompt"),
        ([5] * 1024, {}, ContextLengthExceeded, "prompt"),
        (
            [5] * 1020,
            {"params": SamplingParams(max_tokens=10)},
            ContextLengthExceeded,
            "max_tokens",
        ),
        ([5], {"params": SamplingParams(stop_token_ids=[5000])}, InvalidRequest, "stop_token_ids"),
        ([5], {"params": SamplingParams(logit_bias={9999: 1.0})}, InvalidRequest, "logit_bias"),
        ([5], {"lane": "vip"}, InvalidRequest, "lane"),
        ([5], {"tenant": ""}, InvalidRequest, "tenant"),
        ([5], {"request_id": ""}, InvalidRequest, "request_id"),
    ],
)
def test_bad_requests_raise_and_others_keep_running(make_engine, prompt, kwargs, error, param):
    engine = make_engine(policy=FairSharePolicy(lanes=("realtime", "standard", "bulk")))
    first = engine.add_request([7, 8, 9], GOOD)
    engine.step()
    with pytest.raises(error) as info:
        engine.add_request(prompt, kwargs.pop("params", GOOD), **kwargs)
    assert info.value.param == param
    second = engine.add_request([10, 11], GOOD)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert {done[first].finish_reason, done[second].finish_reason} == {"length"}


def test_context_error_has_its_own_code(make_engine):
    with pytest.raises(ContextLengthExceeded) as info:
        make_engine().add_request([5] * 2000)
    assert info.value.code == "context_length_exceeded"
    assert isinstance(info.value, InvalidRequest)


def test_duplicate_request_id_is_refused(make_engine):
    engine = make_engine()
    engine.add_request([5], GOOD, request_id="same")
    with pytest.raises(InvalidRequest) as info:
        engine.add_request([6], GOOD, request_id="same")
    assert info.value.param == "request_id"


def test_embedding_pooling_must_be_known(make_engine):
    with pytest.raises(InvalidRequest) as info:
        make_engine().add_embedding_request([5], pooling="max")
    assert info.value.param == "pooling"


def test_engine_config_checks_itself():
    with pytest.raises(ValueError):
        EngineConfig(model="x", block_size=12)
    with pytest.raises(ValueError):
        EngineConfig(model="x", max_num_seqs=0)


def test_abort_of_unknown_request_is_harmless(make_engine):
    assert make_engine().abort("nope") is False
