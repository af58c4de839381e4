"""JSON mode on our own engine (guided decoding by llguidance, workers/engine/guide.py) through
the real /v1 path: `response_format` json_object answers a JSON object, json_schema a document
of the schema; a schema the engine cannot enforce is a 400, and nothing is charged."""

import json

import pytest
from asgiref.sync import sync_to_async

from tenants.models import UsageRecord
from tests.engine.guide_helpers import follows, guide_for
from tests.routing.test_routing import chat, streamed
from workers.engine.tokenizer import Tokenizer, byte_tokenizer_write
from workers.serving.jobs import Job

pytestmark = pytest.mark.django_db(transaction=True)
BRACES = {"128": 100, "130": 100}  # the presets' byte tokens for "{" and "}" (5 + the byte)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    """The presets' byte-level tokenizer (the tiny model's)."""
    path = tmp_path_factory.mktemp("tokenizer")
    byte_tokenizer_write(path, model_max_length=512)
    return Tokenizer(path)


def is_json_prefix(tokenizer: Tokenizer, text: str) -> bool:
    return follows(guide_for(tokenizer), tokenizer.encode(text, add_special_tokens=False))


async def test_json_mode_on_the_local_engine_answers_an_object(embedded, key, budget, tokenizer):
    response = await chat(
        key,
        model="tiny",
        max_tokens=10,
        temperature=0,
        logit_bias=BRACES,
        response_format={"type": "json_object"},
    )
    assert response.status_code == 200, response.content
    [choice] = json.loads(response.content)["choices"]
    assert choice["message"]["content"] == "{}" and choice["finish_reason"] == "stop"

    payloads = await streamed(
        await chat(
            key,
            model="tiny",
            max_tokens=24,
            temperature=1.0,
            seed=7,
            stream=True,
            response_format={"type": "json_object"},
        )
    )
    text = "".join(
        p["choices"][0]["delta"].get("content") or ""
        for p in payloads
        if isinstance(p, dict) and p.get("choices")
    )
    assert text.lstrip().startswith("{") and is_json_prefix(tokenizer, text), text


async def test_a_json_schema_on_the_local_engine_is_followed(embedded, key, budget):
    # Blanks are capped, so this schema's documents are short: greedy decoding must end one.
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    response = await chat(
        key,
        model="tiny",
        max_tokens=120,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "strict": True, "schema": schema},
        },
    )
    assert response.status_code == 200, response.content
    [choice] = json.loads(response.content)["choices"]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"])["ok"], bool)


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "not": {"required": ["a"]}}, "not"),  # a keyword llguidance lacks
        ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),  # a pattern it cannot run
    ],
)
async def test_a_schema_the_engine_cannot_enforce_is_a_400_and_costs_nothing(
    embedded, key, budget, schema, words
):
    response = await chat(
        key,
        model="tiny",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "strict": True, "schema": schema},
        },
    )
    assert response.status_code == 400, response.content
    error = json.loads(response.content)["error"]
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_request" and words in error["message"]
    assert "cannot enforce that schema" in error["message"]

    def charged():
        window = budget.windows.get()
        return (
            window.spent_microcents,
            window.reserved_microcents,
            sum(r.cost_microcents for r in UsageRecord.objects.all()),
        )

    assert await sync_to_async(charged)() == (0, 0, 0)


async def test_without_strict_a_keyword_the_engine_lacks_is_ignored_and_the_rest_enforced(
    embedded, key, budget
):
    """OpenAI enforces a schema exactly only under `strict: true`; without it, `uniqueItems`
    (which llguidance cannot enforce) is passed over, and the types still hold."""
    schema = {
        "type": "object",
        "required": ["tags"],
        "properties": {
            "tags": {
                "type": "array",
                "uniqueItems": True,
                "maxItems": 3,
                "items": {"type": "integer"},
            }
        },
    }
    response = await chat(
        key,
        model="tiny",
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert response.status_code == 200, response.content
    [choice] = json.loads(response.content)["choices"]
    if choice["finish_reason"] == "stop":
        tags = json.loads(choice["message"]["content"])["tags"]
        assert len(tags) <= 3 and all(isinstance(t, int) for t in tags)


def test_a_resumed_json_mode_job_replays_its_output_into_the_guide():
    job = Job(
        request_id="r",
        task="generate",
        model={},
        prompts=[[1]],
        sampling={"max_tokens": 10, "guide": "json_object"},
        resumed={0: [128]},
    )
    params = job.choice_params(0)
    assert params.guide_prefix == (128,) and params.max_tokens == 9
