"""The official `openai` client, unmodified, against a live server in the embedded mode."""

import base64
import json

import numpy as np
import openai
import pytest

from tenants.models import Reservation, UsageRecord
from tenants.services.budgets import budget_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(embedded_server, key):
    return openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)


def test_models_list(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "fairlane"
    # vLLM's field, which the portal's playground bounds max_tokens by (issue 28).
    context = client.models.retrieve("tiny").model_extra["max_model_len"]
    assert context == json.loads(client.models.list().to_json())["data"][0]["max_model_len"]
    assert context > 1
    too_long = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": context,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**too_long)
    assert refused.value.code == "context_length_exceeded"


def test_chat_completion_non_streaming_is_metered_once(client, budget):
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in {"stop", "length"}
    assert reply.usage.completion_tokens <= 12 and reply.usage.prompt_tokens > 0
    record = UsageRecord.objects.get(request_id=reply.id.removeprefix("chatcmpl-"))
    assert (record.prompt_tokens, record.completion_tokens) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    uncached = record.prompt_tokens - record.cached_tokens
    assert record.cost_microcents == -(
        -(
            uncached * 10_000_000
            + record.cached_tokens * 5_000_000
            + record.completion_tokens * 40_000_000
        )
        // 1_000_000
    )
    assert Reservation.objects.get(request_id=record.request_id).status == "settled"


def test_chat_completion_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Stream, please"}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["length"] or finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 20
    # Greedy decoding: the stream says what the non-streamed answer says.
    whole = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Stream, please"}],
        max_tokens=20,
        temperature=0,
    )
    assert whole.choices[0].message.content == text
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens


def test_completions_streaming_and_not(client):
    reply = client.completions.create(
        model="tiny", prompt=["one", "two"], max_tokens=5, n=2, temperature=0.8, seed=7, logprobs=2
    )
    assert sorted(c.index for c in reply.choices) == [0, 1, 2, 3]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in reply.choices)
    assert reply.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in reply.choices)
    again = client.completions.create(
        model="tiny", prompt=["one", "two"], max_tokens=5, n=2, temperature=0.8, seed=7, logprobs=2
    )
    assert [c.text for c in again.choices] == [c.text for c in reply.choices]  # seeded

    streamed = list(
        client.completions.create(
            model="tiny", prompt="count:", max_tokens=8, stream=True, echo=True, temperature=0
        )
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text.startswith("count:")


def test_a_stream_echoing_unicode_line_breaks_reads_line_by_line(embedded_server, key):
    """The byte-level `tiny` model can write any character; a line reader that splits where
    str.splitlines() does (httpx's aiter_lines) still reads one chunk a line."""
    import httpx

    prompt = "a\u2028b\u2029c\x85d"
    with httpx.stream(
        "POST",
        embedded_server.url + "/v1/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": 4,
            "echo": True,
            "stream": True,
            "temperature": 0,
        },
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).startswith(prompt)


def test_embeddings_base64_default_and_float(client):
    reply = client.embeddings.create(model="tiny", input=["hello", "world!"])
    vectors = [np.array(d.embedding) for d in reply.data]
    assert [d.index for d in reply.data] == [0, 1] and len(vectors[0]) == 64
    assert np.allclose([np.linalg.norm(v) for v in vectors], 1.0, atol=1e-5)
    raw = client.embeddings.create(model="tiny", input="hello", encoding_format="float")
    assert np.allclose(raw.data[0].embedding, vectors[0], atol=1e-6)
    assert reply.usage.prompt_tokens == len("hello") + len("world!")  # byte tokenizer
    b64 = client.with_raw_response.embeddings.create(
        model="tiny", input="hello", encoding_format="base64"
    )
    payload = b64.http_response.json()["data"][0]["embedding"]
    assert np.allclose(
        np.frombuffer(base64.b64decode(payload), dtype=np.float32), vectors[0], atol=1e-6
    )


def test_a_bad_key_raises_authentication_error(embedded_server, key):
    bad = openai.OpenAI(
        api_key=key[:-3] + "xyz", base_url=embedded_server.url + "/v1", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 100}, "n"),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
        ({"extra_body": {"frobnicate": True}}, "frobnicate"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ],
)
def test_bad_requests_raise_bad_request_error_and_charge_nothing(client, kwargs, param):
    args = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.chat.completions.create(**args)
    assert exc_info.value.body["param"] == param
    assert not Reservation.objects.exists() and not UsageRecord.objects.exists()


def test_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.completions.create(model="tiny", prompt="x" * 1000, max_tokens=100)
    assert exc_info.value.code == "context_length_exceeded"


def test_unknown_model_raises_not_found(client):
    with pytest.raises(openai.NotFoundError) as exc_info:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert exc_info.value.code == "model_not_found"


def test_exhausted_budget_raises_rate_limit_error_without_retrying(
    embedded_server, key, tenant, agent
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    client = openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=2)
    with pytest.raises(openai.RateLimitError) as exc_info:
        client.chat.completions.create(
            model="tiny", max_tokens=100, messages=[{"role": "user", "content": "expensive"}]
        )
    assert exc_info.value.code == "budget_exhausted"
    assert exc_info.value.response.headers["x-should-retry"] == "false"
    assert int(exc_info.value.response.headers["retry-after"]) > 0
    assert not Reservation.objects.exists()


def test_model_register_command_refuses_bad_sources_and_updates_prices(tiny):
    from django.core.management import CommandError, call_command

    from workers.models import ServedModel

    with pytest.raises(CommandError):
        call_command("model_register", "x", "preset:nope")
    with pytest.raises(CommandError):
        call_command("model_register", "x", "relative/dir")
    call_command("model_register", "tiny", "preset:tiny", "--price-output", "7")
    assert ServedModel.objects.get(name="tiny").price_output_per_mtok == 7


def test_logit_bias_and_penalties_reach_the_engine(client):
    from workers.serving.catalog import ModelInfo, model_tokenizer

    forced = client.completions.create(
        model="tiny", prompt="abc", max_tokens=6, temperature=0, logit_bias={"70": 100}
    )
    tokenizer = model_tokenizer(ModelInfo(name="tiny", source="preset:tiny"))
    assert forced.choices[0].text == tokenizer.decode([70] * 6)
    # A strong presence penalty forbids repeating the forced token after its first use.
    varied = client.completions.create(
        model="tiny",
        prompt="abc",
        max_tokens=6,
        temperature=0,
        logit_bias={"70": 3},
        presence_penalty=2.0,
    )
    assert varied.choices[0].text != forced.choices[0].text


def test_v1_runs_without_the_site_middleware_but_checks_host_and_counts(embedded_server, key):
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    spoofed = httpx.get(
        embedded_server.url + "/v1/models", headers={**headers, "Host": "evil.test"}
    )
    assert spoofed.status_code == 400 and spoofed.json()["error"]["code"] == "invalid_request"
    assert (
        "Set-Cookie" not in httpx.get(embedded_server.url + "/v1/models", headers=headers).headers
    )
    metrics = httpx.get(embedded_server.url + "/metrics").text
    assert 'fairlane_api_requests_total{endpoint="models",status="200"}' in metrics


def test_parallel_tool_calls_on_the_local_engine_parse_as_openai_calls_streamed_and_not(client):
    """Several calls in one answer (tool_choice required, parallel_tool_calls by default): the
    client reads each as its own call with its own id, the same streamed as not."""
    flag = {
        "type": "function",
        "function": {
            "name": "set_flag",
            "parameters": {
                "type": "object",
                "required": ["on"],
                "properties": {"on": {"type": "boolean"}},
                "additionalProperties": False,
            },
        },
    }
    args = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "flags"}],
        "tools": [flag],
        "tool_choice": "required",
        "max_tokens": 400,
        "temperature": 1.0,
        # Random weights: no blanks, and fewer ","s, so that answers end (5 + the byte).
        "logit_bias": {"37": -100, "14": -100, "15": -100, "18": -100, "49": -4},
    }
    counts = []
    for seed in range(6):
        reply = client.chat.completions.create(seed=seed, **args)
        with client.chat.completions.stream(seed=seed, **args) as stream:
            streamed = stream.get_final_completion()
        for answer in (reply, streamed):
            [choice] = answer.choices
            assert choice.finish_reason == "tool_calls" and not choice.message.content
        calls, streamed_calls = (
            reply.choices[0].message.tool_calls,
            streamed.choices[0].message.tool_calls,
        )
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            (c.function.name, c.function.arguments) for c in streamed_calls
        ]
        ids = [c.id for c in calls + streamed_calls]
        assert len(set(ids)) == len(ids) and all(c.type == "function" for c in calls)
        assert all(isinstance(json.loads(c.function.arguments)["on"], bool) for c in calls)
        counts.append(len(calls))
    assert max(counts) >= 2, counts
