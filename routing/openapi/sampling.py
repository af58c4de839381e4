"""What chat and text completions share: the sampling parameters (their ranges are
routing/wire/parse.py's), streaming, and the event stream a streamed answer is."""

from __future__ import annotations

from routing.openapi.common import (
    answer,
    boolean,
    integer,
    json_object,
    nullable,
    number,
    ref,
    string,
)
from routing.wire.parse import (
    MAX_CACHE_SALT,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_SEED,
    MAX_STOP,
    TOKEN_ID,
)

MAX_TOKENS = 10_000_000  # the parsers' bound; the model's context is the real one (a 400)


def sampling_properties() -> dict:
    return {
        "model": {
            "type": "string",
            "minLength": 1,
            "description": "A model the key's agent may use (GET /v1/models).",
        },
        "stream": boolean("Stream the answer as server-sent events."),
        "stream_options": nullable(
            json_object(
                {
                    "include_usage": boolean(
                        "End the stream with a chunk holding the usage alone."
                    ),
                    "continuous_usage_stats": {"description": "Accepted and ignored (vLLM's)."},
                },
                description="Only with `stream: true`.",
            )
        ),
        "temperature": number(0, 2),
        "top_p": number(0, 1, low_open=True),
        "top_k": integer(-1, 1_000_000, "vLLM's: 0 or -1 for all tokens."),
        "n": integer(1, MAX_N, "How many choices to generate."),
        "stop": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "array",
                    "maxItems": MAX_STOP,
                    "items": {"type": "string", "minLength": 1},
                },
                {"type": "null"},
            ]
        },
        "seed": integer(-(2**63), MAX_SEED),
        "presence_penalty": number(-2, 2),
        "frequency_penalty": number(-2, 2),
        "repetition_penalty": number(0, 2, low_open=True, description="vLLM's."),
        "logit_bias": nullable(
            {
                "type": "object",
                "maxProperties": MAX_LOGIT_BIAS,
                "propertyNames": {"pattern": f"^{TOKEN_ID.pattern}$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                "description": "Token ids (of the model's tokenizer) to a bias from -100 to 100.",
            }
        ),
        "min_tokens": integer(0, 1_000_000, "vLLM's."),
        "ignore_eos": boolean("vLLM's."),
        "user": string("The end user, for the caller's own records."),
        "metadata": {"description": "Accepted and ignored."},
        "store": {"description": "Accepted and ignored."},
        "service_tier": nullable({"enum": ["auto", "default"]}),
        "cache_salt": string(
            "vLLM's: requests share cached prompt blocks only with the same "
            "salt (and always only within the caller's tenant).",
            minLength=1,
            maxLength=MAX_CACHE_SALT,
        ),
    }


STREAM_OPTIONS_NEED_STREAM = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}


def event_stream(chunk: str) -> dict:
    """`text/event-stream`: each event one `data:` line of a chunk (or, after the first chunk,
    the error that ends the stream), then `data: [DONE]`. Described per event (OpenAPI 3.1:
    the schema of a sequential media type is one item's)."""
    return {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "if": {"const": "[DONE]"},
                    "else": {
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [ref(chunk), ref("ErrorResponse")]},
                    },
                }
            },
            "description": f"A server-sent event: `data: <{chunk} as JSON>`, or `data: [DONE]` "
            "last.",
        }
    }


def generation_answer(whole: str, chunk: str) -> dict:
    return answer(
        f"The whole answer ({whole}), or with `stream: true` an event stream of {chunk}s. "
        "x-fairlane-backend names the backend that answered, x-fairlane-model-version the "
        "model version, x-fairlane-brownout a max_tokens cap applied under load, "
        "x-fairlane-demoted a budget's soft limit that moved it to the bulk lane.",
        {"application/json": {"schema": ref(whole)}, "text/event-stream": event_stream(chunk)},
        headers=("x-request-id",),
    )


def logprob_entry() -> dict:
    token = {
        "token": {"type": "string"},
        "logprob": {"type": ["number", "null"]},
        "bytes": {"type": ["array", "null"], "items": {"type": "integer"}},
    }
    return json_object(
        {
            **token,
            "top_logprobs": {
                "type": "array",
                "items": json_object(token, required=("token", "logprob"), closed=False),
            },
        },
        required=("token", "logprob"),
        closed=False,
        description="A token's log-probability (null where it is -infinity).",
    )
