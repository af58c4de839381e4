"""Hypothesis strategies for hostile client JSON, written as text, so that what no encoder
writes can be sent: lone surrogates as `\\ud800` escapes (and as raw invalid UTF-8), NaN and
Infinity literals, -0, 1e400, integers past a double and past Python's 4300-digit limit on
int(), nesting to any depth, bodies around the size limit. Shared by the fuzzers of the /v1
parsers (in process) and of the live HTTP and websocket API."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# The fuzzers' seed and how many examples they run, as `make test` runs them; a longer or
# different run: FAIRLANE_FUZZ_SCALE=20 FAIRLANE_FUZZ_SEED=7 make test ARGS="tests/routing -k fuzz"
SEED = int(os.environ.get("FAIRLANE_FUZZ_SEED", "20261205"))
SCALE = float(os.environ.get("FAIRLANE_FUZZ_SCALE", "1"))
FUZZ = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def examples(count: int) -> settings:
    """FUZZ with `count` examples (times FAIRLANE_FUZZ_SCALE)."""
    return settings(FUZZ, max_examples=max(1, round(count * SCALE)))


# Number literals at the edges, as JSON text (some are not JSON at all, which is the point).
EDGE_NUMBERS = (
    "0",
    "-0",
    "-0.0",
    "0.0",
    "1",
    "2",
    "4.0",
    "16",
    "17",
    "-1",
    "1.5",
    "0.1e1",
    "1E2",
    "1e308",
    "1e400",
    "-1e400",
    "1e-400",
    "5e-324",
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "9007199254740993",
    str(2**53),
    str(2**63),
    str(-(2**63) - 1),
    str(2**64),
    "123456789012345678901234567890",
    "1" * 4301,
    "1" + "0" * 400 + ".0",
    "1" * 400 + "e-400",
)
# Characters that break naive code: surrogates, NUL, Unicode line breaks (str.splitlines
# splits at them), the BOM, non-characters, bidi overrides, full-width URL delimiters,
# superscript digits (str.isdigit() says yes, int() says no), the chat template's tokens.
EDGE_TEXTS = (
    "\ud800",
    "\udfff",
    "a\udc80b",
    "\ud83d",
    "\x00",
    "\u2028",
    "\u2029",
    "\x85",
    "\r",
    "\n",
    "\r\n",
    "\x0b",
    "\ufeff",
    "\uffff",
    "\U0010ffff",
    "\u202e",
    "\uff03",
    "\uff0f",
    "²",
    "١٢",
    "<|im_start|>",
    "<|im_end|>",
    "</s>",
    "{{ x }}",
    "{% if %}",
    "😀",
    "e\u0301",
    "\\",
    '"',
    "%s",
    "\u0000\u0000",
)


@st.composite
def texts(draw, max_size: int = 40) -> str:
    """Any Python string, surrogates included, often with an edge text spliced in."""
    text = draw(st.text(st.characters(), max_size=max_size))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(EDGE_TEXTS)) + text[cut:]
    return text


def string_literal(text: str, ascii_only: bool = True) -> str:
    """A JSON string: lone surrogates become `\\udXXX` escapes when ascii_only, else stay raw
    (the body is then encoded with surrogatepass: invalid UTF-8)."""
    return json.dumps(text, ensure_ascii=ascii_only)


numbers = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
scalars = st.one_of(
    numbers,
    st.sampled_from(["true", "false", "null"]),
    st.builds(string_literal, texts(), st.booleans()),
)
keys = st.one_of(
    st.sampled_from(
        [
            "model",
            "messages",
            "role",
            "content",
            "type",
            "text",
            "max_tokens",
            "n",
            "stream",
            "prompt",
            "input",
            "tools",
            "function",
            "name",
            "logit_bias",
            "image_url",
            "url",
        ]
    ),
    texts(max_size=12),
)


def _containers(children):
    return st.one_of(
        st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(keys, children), max_size=4).map(
            lambda pairs: "{" + ",".join(f"{string_literal(k)}:{v}" for k, v in pairs) + "}"
        ),
    )


# Any JSON value as text (and some near-JSON: NaN, invalid escapes' neighbours).
values = st.recursive(scalars, _containers, max_leaves=12)


@st.composite
def deep(draw) -> str:
    """Nesting far past any recursion limit, or just under it, in arrays or objects."""
    depth = draw(st.sampled_from([10, 500, 990, 1_000, 5_000, 100_000]))
    if draw(st.booleans()):
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def image_urls() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda t: "http://" + t, texts(max_size=20)),
        st.sampled_from(
            [
                "http://[",
                "http://[::1",
                "http://a]",
                "https://a\uff03b/",
                "https://example.com/x.png",
                "http:///x",
                "data:image/png;base64,",
                "data:image/png;base64,AAAA",
                "data:image/png;base64,%%%",
                "file:///etc/passwd",
                "http://127.0.0.1:99999/",
            ]
        ),
        st.builds(lambda t: "data:image/png;base64," + t, texts(max_size=20)),
    )


def _message(content: str, role: str = '"user"') -> str:
    return '{"role":' + role + ',"content":' + content + "}"


# Where a name belongs (a role, an image's detail, a function's name), anything: a value of
# the wrong type reached set lookups (TypeError: unhashable).
roles = st.one_of(
    st.sampled_from(['"system"', '"user"', '"assistant"', '"developer"', '"tool"']), values
)


@st.composite
def contents(draw) -> str:
    """A message's content as text: a hostile string, content parts, or any value."""
    kind = draw(st.sampled_from(["text", "text", "parts", "value"]))
    if kind == "text":
        return string_literal(draw(texts()), draw(st.booleans()))
    if kind == "parts":
        parts = draw(
            st.lists(
                st.one_of(
                    st.builds(
                        lambda t: '{"type":"text","text":' + string_literal(t) + "}", texts()
                    ),
                    st.builds(
                        lambda u, d: (
                            '{"type":"image_url","image_url":{"url":' + string_literal(u) + d + "}}"
                        ),
                        image_urls(),
                        st.one_of(
                            st.just(""),
                            st.builds(
                                lambda v: ',"detail":' + v, st.one_of(st.just('"low"'), values)
                            ),
                        ),
                    ),
                    values,
                ),
                min_size=1,
                max_size=3,
            )
        )
        return "[" + ",".join(parts) + "]"
    return draw(values)


def _object(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f"{string_literal(k)}:{v}" for k, v in pairs.items()) + "}"


strings = st.builds(string_literal, texts(), st.booleans())
integers = st.one_of(st.sampled_from(EDGE_NUMBERS), st.integers(-3, 20).map(str))
# JSON Schemas as a client may send them in tools and response formats: keywords with edge
# values (a guided decoder compiles them).
SCHEMA_KEYWORDS = (
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "additionalProperties",
    "minItems",
    "maxItems",
    "multipleOf",
    "not",
    "prefixItems",
    "uniqueItems",
    "default",
)
schema_values = st.one_of(
    st.sampled_from(
        [
            '"object"',
            '"string"',
            '"integer"',
            '"number"',
            '"array"',
            '"boolean"',
            '"null"',
            '["string","null"]',
            '"(a|b"',
            '"^[a-z]{1,1000000}$"',
            '"#/$defs/x"',
            '"#"',
            '"date-time"',
            '"email"',
            "true",
            "false",
        ]
    ),
    integers,
    values,
)
schemas = st.recursive(
    st.dictionaries(st.sampled_from(SCHEMA_KEYWORDS), schema_values, max_size=3).map(_object),
    lambda children: st.one_of(
        st.dictionaries(
            st.sampled_from(SCHEMA_KEYWORDS), st.one_of(schema_values, children), max_size=4
        ).map(_object),
        st.dictionaries(st.sampled_from(["a", "b", ""]), children, max_size=3).map(
            lambda props: '{"type":"object","properties":' + _object(props) + "}"
        ),
    ),
    max_leaves=8,
)
tools = st.lists(
    st.builds(
        lambda name, parameters: (
            '{"type":"function","function":{"name":' + name + ',"parameters":' + parameters + "}}"
        ),
        st.one_of(st.just('"f"'), strings),
        schemas,
    ),
    min_size=1,
    max_size=2,
).map(lambda items: "[" + ",".join(items) + "]")
response_formats = st.one_of(
    st.sampled_from(['{"type":"json_object"}', '{"type":"text"}']),
    schemas.map(
        lambda schema: '{"type":"json_schema","json_schema":{"name":"s","schema":' + schema + "}}"
    ),
)
logit_biases = st.builds(
    lambda k, v: "{" + string_literal(k) + ":" + v + "}",
    st.one_of(texts(8), st.sampled_from(["²", "0" * 5000, "7", "-1", "1e3", " 7", "260", "261"])),
    numbers,
)
# Each field with values of its own type at the edges most of the time, else anything.
FIELDS = {
    "max_tokens": integers,
    "max_completion_tokens": integers,
    "n": integers,
    "seed": integers,
    "top_logprobs": integers,
    "top_k": integers,
    "min_tokens": integers,
    "logprobs": st.one_of(st.sampled_from(["true", "false"]), integers),
    "best_of": integers,
    "dimensions": integers,
    "temperature": numbers,
    "top_p": numbers,
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "repetition_penalty": numbers,
    "stop": st.one_of(
        strings, st.lists(strings, max_size=5).map(lambda items: "[" + ",".join(items) + "]")
    ),
    "user": strings,
    "cache_salt": strings,
    "suffix": strings,
    "encoding_format": strings,
    "echo": st.sampled_from(["true", "false", "null", "1"]),
    "logit_bias": logit_biases,
    "tools": tools,
    "tool_choice": st.one_of(
        st.sampled_from(['"auto"', '"none"', '"required"']),
        values,
        st.builds(
            lambda name: '{"type":"function","function":{"name":' + name + "}}",
            st.one_of(st.just('"f"'), values),
        ),
    ),
    "response_format": response_formats,
    "stream_options": st.sampled_from(
        ['{"include_usage":true}', '{"include_usage":1}', "{}", '{"x":1}', "[]"]
    ),
    "modalities": st.sampled_from(['["text"]', '["audio"]', "[]"]),
    "parallel_tool_calls": st.sampled_from(["true", "false", '"yes"']),
    "metadata": values,
}
ENDPOINT_FIELDS = {
    "chat": (
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "tools",
        "tool_choice",
        "response_format",
        "stream_options",
        "user",
        "presence_penalty",
        "top_k",
        "min_tokens",
        "cache_salt",
        "modalities",
        "metadata",
        "parallel_tool_calls",
        "repetition_penalty",
        "frequency_penalty",
    ),
    "completion": (
        "max_tokens",
        "temperature",
        "n",
        "stop",
        "seed",
        "logprobs",
        "echo",
        "best_of",
        "suffix",
        "logit_bias",
        "stream_options",
        "user",
        "min_tokens",
    ),
    "embedding": ("encoding_format", "dimensions", "user"),
}
ENDPOINTS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
}


@st.composite
def field_values(draw, endpoint: str) -> dict[str, str]:
    """Usually one of the endpoint's fields (or an unknown one) set to an edge value, now and
    then none or several, so that most cases pass every check but one."""
    count = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
    chosen = {}
    for _ in range(count):
        name = draw(st.sampled_from(ENDPOINT_FIELDS[endpoint]) if draw(st.integers(0, 3)) else keys)
        own = FIELDS.get(name, values)
        chosen[name] = draw(st.one_of(own, own, own, values))
    return chosen


@st.composite
def prompts(draw) -> str:
    return draw(
        st.one_of(
            strings,
            strings,
            st.lists(st.integers(-1, 300).map(str), min_size=1, max_size=5).map(
                lambda ids: "[" + ",".join(ids) + "]"
            ),
            st.lists(strings, min_size=1, max_size=3).map(
                lambda items: "[" + ",".join(items) + "]"
            ),
            values,
        )
    )


@st.composite
def bodies(draw, endpoint: str) -> str:
    """A request body for `endpoint` as JSON text: mostly a small valid request with one
    hostile part (so that it passes the other checks and reaches the later ones), sometimes
    something hostile as a whole."""
    shape = draw(st.sampled_from(["request"] * 8 + ["deep", "value"]))
    if shape == "deep":
        return draw(deep())
    if shape == "value":
        return draw(values)
    fields = {
        "model": '"tiny"',
        "max_tokens": str(draw(st.integers(1, 4))),
        "stream": draw(st.sampled_from(["true", "false"])),
    }
    if endpoint == "chat":
        messages = [_message(draw(strings), draw(roles)) for _ in range(draw(st.integers(0, 2)))]
        messages.append(_message(draw(contents())))
        fields["messages"] = "[" + ",".join(messages) + "]"
    else:
        fields["prompt" if endpoint == "completion" else "input"] = draw(prompts())
    if endpoint == "embedding":
        del fields["max_tokens"], fields["stream"]
    fields.update(draw(field_values(endpoint)))
    return _object(fields)


def encoded(text: str) -> bytes:
    """Bytes as sent: raw surrogates (from string_literal(ascii_only=False)) as invalid UTF-8."""
    return text.encode("utf-8", "surrogatepass")
