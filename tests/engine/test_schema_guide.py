"""Structured outputs in the engine (llguidance): a JSON schema's guide accepts the documents of
that schema (properties in its order) and nothing else, value constraints included; guided
walks and guided requests at temperature 1 end in valid documents, many seeds over."""

from __future__ import annotations

import calendar
import json
import re

import jsonschema
import pydantic
import pytest

from tests.engine.guide_helpers import accepts, byte_ids, guide_for, random_walk
from workers.engine import SamplingParams
from workers.engine.errors import InvalidRequest
from workers.engine.guide import schema_closed
from workers.engine.tokenizer import Tokenizer


class Place(pydantic.BaseModel):
    name: str
    kind: str = pydantic.Field(json_schema_extra={"enum": ["city", "village"]})


class Forecast(pydantic.BaseModel):
    place: Place
    celsius: float
    days: list[int]
    windy: bool | None
    note: str | None = None


FORECAST = Forecast.model_json_schema()  # $defs and $ref, anyOf with null, as the client sends
SCHEMA = {
    "type": "object",
    "required": ["a", "c"],
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string"},
        "c": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "x"},
                    {"type": "number"},
                    {"type": "object", "properties": {"deep": {"type": ["boolean", "null"]}}},
                ]
            },
        },
    },
}
# Every value constrained beyond its type: what a guide that knew only types would break.
CONSTRAINED = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "name": {"type": "string", "minLength": 2, "maxLength": 4},
        "count": {"type": "integer", "minimum": 3, "maximum": 7},
        "ratio": {"type": "number", "minimum": -1, "exclusiveMaximum": 1},
        "unit": {"enum": ["celsius", "fahrenheit", 3, None]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 2},
            "minItems": 2,
            "maxItems": 3,
        },
        "day": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
    },
}
CONSTRAINED["required"] = list(CONSTRAINED["properties"])
# The same shape guided by types alone (strings short, so that documents end).
TYPES_ONLY = {
    **CONSTRAINED,
    "properties": {
        **{name: {"type": "string", "maxLength": 8} for name in ("code", "name", "day", "id")},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "unit": {"type": ["string", "integer", "null"], "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 5},
    },
}
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date")
def _full_date(value) -> bool:
    """RFC 3339's full-date. jsonschema's own check is Python's date, which has no year 0000."""
    match = isinstance(value, str) and re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", value)
    if not match:
        return not isinstance(value, str)
    year, month, day = map(int, match.groups())
    return 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year or 2000, month)[1]


def valid(doc, schema) -> bool:
    return jsonschema.Draft202012Validator(schema, format_checker=FORMATS).is_valid(doc)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


@pytest.mark.parametrize(
    "doc",
    [
        {"a": 1, "c": []},
        {"a": -20, "b": "é\n", "c": ["x", 1.5e3, {}, {"deep": None}]},
        {"a": 0, "c": [{"deep": True}, -0.5]},
    ],
)
def test_documents_of_the_schema_are_accepted(tokenizer, doc):
    assert accepts(tokenizer, json.dumps(doc, separators=(",", ":")).encode(), SCHEMA)


@pytest.mark.parametrize(
    "data",
    [
        b'{"c":[],"a":1}',  # out of the schema's order
        b'{"c":[]}',
        b'{"a":1}',  # a required property missing
        b'{"a":1.5,"c":[]}',
        b'{"a":"1","c":[]}',  # wrong types
        b'{"a":1,"c":["y"]}',
        b'{"a":1,"c":[{"deep":1}]}',
        b'{"a":1,"c":[],"z":0}',  # not in the schema
        b'{"a":1,"c":[{"deep":null,"z":0}]}',  # nor in a nested one
        b'{"a":1,"c":[]',
        b"[]",
    ],
)
def test_anything_else_is_refused(tokenizer, data):
    assert not accepts(tokenizer, data, SCHEMA)


@pytest.mark.parametrize(
    "field, good, bad",
    [
        ("code", "ABC-12", "AB-12"),
        ("name", "abcd", "abcde"),
        ("name", "ab", "a"),
        ("count", 7, 8),
        ("count", 3, 2),
        ("ratio", -1, 1),
        ("unit", None, "kelvin"),
        ("tags", ["a", "b"], ["a"]),
        ("tags", ["a", "b", "c"], ["a", "b", "c", "d"]),
        ("tags", ["ab", "c"], ["abc", "c"]),
        ("day", "2024-02-29", "2024-13-01"),
        ("id", "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456"),
    ],
)
def test_value_constraints_are_enforced(tokenizer, field, good, bad):
    doc = {
        "code": "ABC-12",
        "name": "ab",
        "count": 5,
        "ratio": 0.5,
        "unit": 3,
        "tags": ["a", "b"],
        "day": "2024-01-31",
        "id": "123e4567-e89b-12d3-a456-426614174000",
    }
    assert accepts(
        tokenizer, json.dumps({**doc, field: good}, separators=(",", ":")).encode(), CONSTRAINED
    )
    assert not accepts(
        tokenizer, json.dumps({**doc, field: bad}, separators=(",", ":")).encode(), CONSTRAINED
    )


def test_pydantic_schemas_with_refs_and_nullable_fields(tokenizer):
    doc = Forecast(place=Place(name="Oslo", kind="city"), celsius=-3.5, days=[1, 2], windy=None)
    assert accepts(tokenizer, doc.model_dump_json().encode(), FORECAST)
    assert not accepts(
        tokenizer,
        b'{"place":{"name":"Oslo","kind":"town"},"celsius":1,"days":[],"windy":true}',
        FORECAST,
    )


def test_objects_without_a_word_on_other_properties_get_none_but_may_ask_for_them():
    closed = schema_closed(
        {
            "type": "object",
            "properties": {"a": {"properties": {}}},
            "$defs": {"d": {"properties": {"properties": {}}}},
            "allOf": [{"properties": {"b": {}}}],
        }
    )
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["d"] == {"properties": {"properties": {}}, "additionalProperties": False}
    assert "additionalProperties" not in closed  # its allOf's branches name its parts
    assert "additionalProperties" not in closed["allOf"][0]
    assert schema_closed({"type": "object"}) == {"type": "object"}  # any object
    assert schema_closed({"properties": {}, "additionalProperties": True}) == {
        "properties": {},
        "additionalProperties": True,
    }


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"not": {}}, "not"),
        ({"$ref": "http://x/s.json"}, "http://x/s.json"),
        ({"type": "tuple"}, "tuple"),
        ([1], "object"),
        ({"type": "string", "pattern": "(?=a)"}, "look-around"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
    ],
)
def test_schemas_it_cannot_enforce_are_refused(tokenizer, schema, words):
    with pytest.raises(InvalidRequest) as exc_info:
        guide_for(tokenizer, schema)
    assert exc_info.value.param == "response_format" and words in str(exc_info.value)


@pytest.mark.parametrize("schema", [SCHEMA, FORECAST, CONSTRAINED])
def test_guided_walks_over_a_real_vocabulary_end_in_valid_documents(tokenizer, schema):
    closing = {b"]", b"}", b'"', b"0", b",", b"n", b"t"}
    for seed in range(25):
        out = random_walk(tokenizer, guide_for(tokenizer, schema), seed, closing=closing)
        assert valid(json.loads(out), schema), out


def _generate(engine, prompts, schema, seeds, **sampling):
    params = [
        SamplingParams(
            max_tokens=200,
            temperature=1.0,
            seed=s,
            guide="json_schema",
            guide_schema=json.dumps(schema),
            **sampling,
        )
        for s in seeds
    ]
    return engine.generate([prompts[s % len(prompts)] for s in seeds], params)


def test_schema_guided_requests_at_temperature_1_answer_valid_documents(
    make_engine, prompts, tokenizer
):
    engine = make_engine()
    for schema in (SCHEMA, FORECAST):
        for output in _generate(engine, prompts, schema, range(8)):
            text = tokenizer.decode(output.token_ids)
            assert text.startswith("{"), text
            if output.finish_reason == "stop":
                assert valid(json.loads(text), schema), text


def test_value_constraints_hold_in_generated_documents_where_types_alone_would_not(
    make_engine, prompts, tokenizer
):
    # The tiny model's weights are random and love blanks: biased against them, documents
    # end within max_tokens (blanks stay allowed; the grammar never needs them).
    compact = {"logit_bias": dict.fromkeys(byte_ids(tokenizer, b" \t\n\r"), -100)}
    engine = make_engine()
    outputs = _generate(engine, prompts, CONSTRAINED, range(10), **compact)
    finished = [
        json.loads(tokenizer.decode(o.token_ids)) for o in outputs if o.finish_reason == "stop"
    ]
    assert len(finished) >= 8
    assert all(valid(doc, CONSTRAINED) for doc in finished), finished
    # The same model and seeds guided by the types alone break the constraints: the test
    # above would see it if they were not enforced.
    loose = [
        json.loads(tokenizer.decode(o.token_ids))
        for o in _generate(engine, prompts, TYPES_ONLY, range(10), **compact)
        if o.finish_reason == "stop"
    ]
    assert len(loose) >= 3 and not any(valid(doc, CONSTRAINED) for doc in loose)
