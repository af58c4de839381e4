"""POST /v1/completions (legacy text completions): prompts as routing/wire/parse.py takes them
(a string, token ids, or a batch of either), the answer as routing/wire/render.py writes it."""

from __future__ import annotations

from routing.openapi.common import (
    FALSY,
    boolean,
    error_responses,
    integer,
    json_object,
    ref,
)
from routing.openapi.sampling import (
    MAX_TOKENS,
    STREAM_OPTIONS_NEED_STREAM,
    generation_answer,
    sampling_properties,
)
from routing.wire.parse import MAX_BATCH_INPUTS, MAX_LEGACY_LOGPROBS, MAX_N

TOKEN_IDS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0},
    "description": "Token ids of the model's tokenizer (an id outside its vocabulary is a 400).",
}


def inputs(description: str) -> dict:
    text = {"type": "string", "minLength": 1}
    return {
        "anyOf": [
            text,
            TOKEN_IDS,
            {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH_INPUTS,
                "items": {"anyOf": [text, TOKEN_IDS]},
            },
        ],
        "description": description,
    }


# best_of must equal n (more would need hidden samples): one branch per n.
BEST_OF_IS_N = {
    "anyOf": [
        {"not": {"required": ["best_of"]}},
        {"properties": {"best_of": {"type": "null"}}},
        {"properties": {"best_of": {"const": 1}, "n": {"enum": [1, None]}}},
        *(
            {"properties": {"best_of": {"const": n}, "n": {"const": n}}, "required": ["n"]}
            for n in range(2, MAX_N + 1)
        ),
    ]
}


def request() -> dict:
    properties = {
        **sampling_properties(),
        "prompt": inputs(f"A string, token ids, or a batch of up to {MAX_BATCH_INPUTS} of either."),
        "max_tokens": integer(
            1, MAX_TOKENS, "Default 16. Prompt and completion must fit the model's context."
        ),
        "logprobs": integer(0, MAX_LEGACY_LOGPROBS, "The chosen token's and the top k's."),
        "echo": boolean("Start each choice with its prompt."),
        "best_of": integer(1, MAX_N, "Accepted equal to `n` only."),
        "suffix": FALSY,
    }
    return json_object(
        properties, required=("model", "prompt"), allOf=[STREAM_OPTIONS_NEED_STREAM, BEST_OF_IS_N]
    )


def _logprobs() -> dict:
    return {
        "type": ["object", "null"],
        "properties": {
            "tokens": {"type": "array", "items": {"type": "string"}},
            "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
            "top_logprobs": {"type": ["array", "null"], "items": {"type": ["object", "null"]}},
            "text_offset": {"type": "array", "items": {"type": "integer"}},
        },
    }


def _completion(chunk: bool) -> dict:
    choice = json_object(
        {
            "index": {"type": "integer"},
            "text": {"type": "string"},
            "logprobs": _logprobs(),
            "finish_reason": {"type": ["string", "null"] if chunk else "string"},
        },
        required=("index", "text", "finish_reason"),
        closed=False,
    )
    return json_object(
        {
            "id": {"type": "string"},
            "object": {"const": "text_completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "system_fingerprint": {"type": ["string", "null"]},
            "choices": {"type": "array", "items": choice},
            "usage": {"anyOf": [ref("Usage"), {"type": "null"}]} if chunk else ref("Usage"),
        },
        required=("id", "object", "created", "model", "choices") + (() if chunk else ("usage",)),
        closed=False,
    )


def schemas() -> dict:
    return {
        "CreateCompletionRequest": request(),
        "Completion": _completion(chunk=False),
        "CompletionChunk": _completion(chunk=True),
    }


PATHS = {
    "/completions": {
        "post": {
            "operationId": "createCompletion",
            "summary": "Text completion (legacy)",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("CreateCompletionRequest")}},
            },
            "responses": {
                "200": generation_answer("Completion", "CompletionChunk"),
                **error_responses("400", "404", "429", "504"),
            },
        }
    },
}
