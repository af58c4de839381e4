"""Structured outputs in the engine: a JSON schema's grammar accepts the documents of that
schema (properties in its order) and nothing else, and a guided walk over a real vocabulary
always ends in a valid document."""

from __future__ import annotations

import json
import random

import jsonschema
import pydantic
import pytest

from workers.engine import SamplingParams
from workers.engine.errors import InvalidRequest
from workers.engine.guide import JsonGuide
from workers.engine.schema_guide import SchemaGrammar
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
SCHEMA = {"type": "object", "required": ["a", "c"], "properties": {
    "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "array", "items": {
        "anyOf": [{"const": "x"}, {"type": "number"}, {"type": "object", "properties": {
            "deep": {"type": ["boolean", "null"]}}}]}}}}


def accepts(grammar: SchemaGrammar, data: bytes) -> bool:
    state = grammar.start
    for byte in data:
        state = grammar.step(state, byte)
        if state is None:
            return False
    return grammar.is_done(state)


@pytest.mark.parametrize("doc", [
    {"a": 1, "c": []}, {"a": -20, "b": "é\n", "c": ["x", 1.5e3, {}, {"deep": None}]},
    {"a": 0, "c": [{"deep": True}, -0.5]},
])
@pytest.mark.parametrize("indent", [None, 2])
def test_documents_of_the_schema_are_accepted(doc, indent):
    assert accepts(SchemaGrammar(SCHEMA), json.dumps(doc, indent=indent).encode())


@pytest.mark.parametrize("data", [
    b'{"c": [], "a": 1}',  # out of the schema's order
    b'{"c": []}', b'{"a": 1}',  # a required property missing
    b'{"a": 1.5, "c": []}', b'{"a": "1", "c": []}',  # wrong types
    b'{"a": 1, "c": ["y"]}', b'{"a": 1, "c": [{"deep": 1}]}',
    b'{"a": 1, "c": [], "z": 0}',  # not in the schema
    b'{"a": 1, "c": []', b"[]",
])
def test_anything_else_is_refused(data):
    assert not accepts(SchemaGrammar(SCHEMA), data)


def test_pydantic_schemas_with_refs_and_nullable_fields():
    grammar = SchemaGrammar(FORECAST)
    doc = Forecast(place=Place(name="Oslo", kind="city"), celsius=-3.5, days=[1, 2], windy=None)
    assert accepts(grammar, doc.model_dump_json().encode())
    assert not accepts(grammar, b'{"place": {"name": "Oslo", "kind": "town"}, "celsius": 1, '
                                b'"days": [], "windy": true}')


@pytest.mark.parametrize("schema", [{"allOf": [{}]}, {"$ref": "http://x/s.json"},
                                    {"type": "tuple"}, {"not": {}}, [1]])
def test_schemas_it_cannot_enforce_are_refused(schema):
    with pytest.raises(InvalidRequest) as exc_info:
        SchemaGrammar(schema)
    assert exc_info.value.param == "response_format"


@pytest.mark.parametrize("schema", [SCHEMA, FORECAST])
def test_guided_walks_over_a_real_vocabulary_end_in_valid_documents(tiny_dir, schema):
    tokenizer = Tokenizer(tiny_dir)
    table, eos = tokenizer.token_bytes_table(), (tokenizer.eos_token_id,)
    guide = JsonGuide(table, eos, SchemaGrammar(schema))
    closing = {b"]", b"}", b'"', b"0", b",", b"n", b"t"}
    for seed in range(25):
        rng, state, out = random.Random(seed), guide.grammar.start, b""
        for _ in range(3000):
            allowed = guide.allowed_ids(state)
            assert allowed, out
            if eos[0] in allowed and rng.random() < 0.5 or allowed == list(eos):
                break
            choices = [t for t in allowed if t not in eos]
            preferred = [t for t in choices if table[t] in closing]
            token = rng.choice(preferred if preferred and rng.random() < 0.6 else choices)
            state = guide.advance(state, table[token])
            out += table[token]
        jsonschema.validate(json.loads(out), schema)


def test_a_schema_guided_engine_request(make_engine, prompts, tiny_dir):
    tokenizer = Tokenizer(tiny_dir)
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, guide="json_schema",
                             guide_schema=json.dumps(schema)) for s in range(4)]
    for output in make_engine().generate(prompts[:4], params):
        text = tokenizer.decode(output.token_ids)
        if output.finish_reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        assert text.lstrip().startswith('{')
