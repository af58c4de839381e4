"""Request parsing: what OpenAI accepts is accepted, anything else is a 400 naming its param."""

import pytest

from routing.wire.parse import (
    chat_request_parse,
    completion_request_parse,
    embedding_request_parse,
)
from tenants.errors import InvalidRequest

MSG = [{"role": "user", "content": "hi"}]


def test_chat_defaults_and_content_parts():
    request = chat_request_parse(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        }
    )
    assert request.messages[1] == {"role": "user", "content": "ab"}
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.n) == (
        None,
        1.0,
        1.0,
        1,
    )
    assert not request.stream and sampling.logprobs is None


def test_chat_max_completion_tokens_wins_and_logprobs_map():
    request = chat_request_parse(
        {
            "model": "m",
            "messages": MSG,
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "logprobs": True,
            "top_logprobs": 3,
            "stop": "x",
            "seed": 2.0,
        }
    )
    assert request.sampling.max_tokens == 7 and request.sampling.logprobs == 3
    assert request.sampling.stop == ("x",) and request.sampling.seed == 2


def test_penalties_and_logit_bias_map_to_the_engine():
    sampling = chat_request_parse(
        {
            "model": "m",
            "messages": MSG,
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "repetition_penalty": 1.2,
            "logit_bias": {"7": 5, "3": -100},
        }
    ).sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -1.0)
    assert sampling.repetition_penalty == 1.2
    assert sampling.logit_bias == ((3, -100.0), (7, 5.0))


def test_neutral_values_of_unsupported_features_are_accepted():
    chat_request_parse(
        {
            "model": "m",
            "messages": MSG,
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "logit_bias": {},
            "tools": [],
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "user": "u-1",
            "store": False,
            "metadata": {"a": "b"},
        }
    )


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "model"),
        ({"model": ""}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"model": "m", "messages": MSG, "temperature": 2.5}, "temperature"),
        ({"model": "m", "messages": MSG, "temperature": "1"}, "temperature"),
        ({"model": "m", "messages": MSG, "top_p": 0}, "top_p"),
        ({"model": "m", "messages": MSG, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": MSG, "max_tokens": 1.5}, "max_tokens"),
        ({"model": "m", "messages": MSG, "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": MSG, "n": 17}, "n"),
        ({"model": "m", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "messages": MSG, "stop": [""]}, "stop"),
        ({"model": "m", "messages": MSG, "top_logprobs": 2}, "top_logprobs"),
        ({"model": "m", "messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (
            {"model": "m", "messages": MSG, "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"model": "m", "messages": MSG, "presence_penalty": 2.5}, "presence_penalty"),
        ({"model": "m", "messages": MSG, "repetition_penalty": 0}, "repetition_penalty"),
        ({"model": "m", "messages": MSG, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": True}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "response_format": {"type": "xml"}}, "response_format"),
        ({"model": "m", "messages": MSG, "functions": [{"name": "f"}]}, "functions"),
        ({"model": "m", "messages": MSG, "bogus": 1}, "bogus"),
    ],
)
def test_chat_rejections_name_the_param(body, param):
    with pytest.raises(InvalidRequest) as exc_info:
        chat_request_parse(body)
    assert exc_info.value.param == param


@pytest.mark.parametrize("body", [None, [], "text", 3])
def test_non_object_bodies_are_refused(body):
    with pytest.raises(InvalidRequest):
        chat_request_parse(body)


def test_completion_prompts_in_every_shape():
    assert completion_request_parse({"model": "m", "prompt": "a"}).prompts == ["a"]
    assert completion_request_parse({"model": "m", "prompt": [1, 2]}).prompts == [[1, 2]]
    assert completion_request_parse({"model": "m", "prompt": ["a", [3]]}).prompts == ["a", [3]]
    assert completion_request_parse({"model": "m", "prompt": "a"}).sampling.max_tokens == 16
    for bad in [[], "", [-1], [True], [[]], {"a": 1}, ["a", 1]]:
        with pytest.raises(InvalidRequest) as exc_info:
            completion_request_parse({"model": "m", "prompt": bad})
        assert exc_info.value.param == "prompt"
    with pytest.raises(InvalidRequest):
        completion_request_parse({"model": "m", "prompt": "a", "suffix": "z"})
    with pytest.raises(InvalidRequest):
        completion_request_parse({"model": "m", "prompt": "a", "best_of": 3})


def test_embedding_inputs_and_format():
    request = embedding_request_parse(
        {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}
    )
    assert request.inputs == ["a", "b"] and request.encoding_format == "base64"
    for body, param in [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": ["a"] * 300}, "input"),
    ]:
        with pytest.raises(InvalidRequest) as exc_info:
            embedding_request_parse(body)
        assert exc_info.value.param == param


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
    ],
)
def test_unhashable_unsupported_values_are_400_not_500(body, param):
    with pytest.raises(InvalidRequest) as exc_info:
        chat_request_parse({"model": "m", "messages": MSG, **body})
    assert exc_info.value.param == param
    chat_request_parse({"model": "m", "messages": MSG, "modalities": ["text"]})
