"""POST /v1/chat/completions: messages, tools and response formats as routing/wire/
messages.py and tools.py take them; the answer as routing/wire/render.py writes it."""

from __future__ import annotations

from routing.openapi.common import (
    FALSY,
    NEUTRAL,
    boolean,
    error_responses,
    integer,
    json_object,
    nullable,
    ref,
)
from routing.openapi.sampling import (
    MAX_TOKENS,
    STREAM_OPTIONS_NEED_STREAM,
    generation_answer,
    logprob_entry,
    sampling_properties,
)
from routing.wire.messages import DETAILS, TOOL_CALL_ID
from routing.wire.parse import MAX_TOP_LOGPROBS
from routing.wire.tools import MAX_TOOLS, NAME

NAMED = {"type": "string", "pattern": f"^{NAME.pattern}$"}
TEXT_PART = json_object(
    {"type": {"const": "text"}, "text": {"type": "string"}}, required=("type", "text"), closed=False
)
IMAGE_PART = json_object(
    {
        "type": {"const": "image_url"},
        "image_url": json_object(
            {
                "url": {
                    "type": "string",
                    "minLength": 1,
                    "description": "http(s) (up to 2048 characters), or a base64 data URL of a "
                    "PNG, "
                    "JPEG, GIF or WebP image.",
                },
                "detail": nullable({"enum": sorted(DETAILS)}),
            },
            required=("url",),
        ),
    },
    required=("type", "image_url"),
    closed=False,
    description="Only for models with a backend that takes images (a 400 otherwise).",
)
TEXT_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]}


def _message(role: str, content: dict, **extra) -> dict:
    """A message of `role`; unknown keys (as `name`) are accepted and not forwarded."""
    return json_object(
        {
            "role": {"const": role},
            "content": content,
            "tool_calls": {"type": "null"},
            "function_call": FALSY,
            **extra,
        },
        required=("role", "content"),
        closed=False,
    )


TOOL_CALL = json_object(
    {
        "id": {"type": "string", "minLength": 1},
        "type": {"const": "function"},
        "function": json_object(
            {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}},
            required=("name", "arguments"),
            closed=False,
        ),
    },
    required=("id", "function"),
    closed=False,
)
ASSISTANT = json_object(
    {
        "role": {"const": "assistant"},
        "content": nullable(TEXT_CONTENT),
        "tool_calls": nullable({"type": "array", "minItems": 1, "items": TOOL_CALL}),
        "function_call": FALSY,
    },
    required=("role",),
    closed=False,
    anyOf=[
        {"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}},
        {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
    ],
    description="Its content may be null (or absent) when it has tool calls.",
)
MESSAGE = {
    "oneOf": [
        _message("system", TEXT_CONTENT),
        _message("developer", TEXT_CONTENT),
        _message(
            "user",
            {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"anyOf": [TEXT_PART, IMAGE_PART]}},
                ]
            },
        ),
        ASSISTANT,
        _message(
            "tool",
            TEXT_CONTENT,
            tool_call_id={"type": "string", "pattern": f"^{TOOL_CALL_ID.pattern}$"},
        )
        | {"required": ["role", "content", "tool_call_id"]},
    ]
}
FUNCTION = json_object(
    {
        "name": NAMED,
        "description": nullable({"type": "string"}),
        "parameters": nullable({"type": "object", "description": "A JSON Schema."}),
        "strict": boolean(),
    },
    required=("name",),
)
TOOL = json_object(
    {"type": {"const": "function"}, "function": FUNCTION}, required=("type", "function")
)
RESPONSE_FORMAT = {
    "oneOf": [
        json_object({"type": {"const": "text"}}, required=("type",)),
        json_object({"type": {"const": "json_object"}}, required=("type",)),
        json_object(
            {
                "type": {"const": "json_schema"},
                "json_schema": json_object(
                    {
                        "name": NAMED,
                        "description": nullable({"type": "string"}),
                        "schema": nullable({"type": "object", "description": "A JSON Schema."}),
                        "strict": boolean(),
                    },
                    required=("name",),
                ),
            },
            required=("type", "json_schema"),
        ),
        {"type": "null"},
    ]
}
TOOL_CHOICE = nullable(
    {
        "anyOf": [
            {"enum": ["none", "auto", "required"]},
            json_object(
                {
                    "type": {"const": "function"},
                    "function": json_object({"name": NAMED}, required=("name",)),
                },
                required=("type", "function"),
                description="Must name one of `tools`.",
            ),
        ]
    }
)


def request() -> dict:
    properties = {
        **sampling_properties(),
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "max_completion_tokens": integer(
            1,
            MAX_TOKENS,
            "Wins over max_tokens. Prompt and completion must fit the model's context.",
        ),
        "max_tokens": integer(1, MAX_TOKENS, "Default: what the model's context leaves."),
        "logprobs": boolean(),
        "top_logprobs": integer(0, MAX_TOP_LOGPROBS, "Only with `logprobs: true`."),
        "tools": nullable(
            {
                "type": "array",
                "maxItems": MAX_TOOLS,
                "items": TOOL,
                "description": "Function names must be unique.",
            }
        ),
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": boolean(),
        "response_format": RESPONSE_FORMAT,
        "modalities": nullable({"const": ["text"]}),
        "functions": FALSY,
        "function_call": FALSY,
        **dict.fromkeys(("audio", "prediction", "web_search_options", "reasoning_effort"), NEUTRAL),
    }
    return json_object(
        properties,
        required=("model", "messages"),
        allOf=[
            STREAM_OPTIONS_NEED_STREAM,
            {
                "if": {
                    "required": ["top_logprobs"],
                    "properties": {"top_logprobs": {"type": "integer"}},
                },
                "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
            },
            {
                "if": {
                    "required": ["tool_choice"],
                    "properties": {"tool_choice": {"not": {"enum": ["none", "auto", None]}}},
                },
                "then": {"required": ["tools"], "properties": {"tools": {"minItems": 1}}},
            },
        ],
    )


def _choice_message() -> dict:
    return json_object(
        {
            "role": {"const": "assistant"},
            "content": {"type": ["string", "null"]},
            "refusal": {"type": "null"},
            "annotations": {"type": "array"},
            "tool_calls": {"type": "array", "items": TOOL_CALL},
        },
        required=("role", "content"),
        closed=False,
    )


def _logprobs() -> dict:
    return {
        "type": ["object", "null"],
        "properties": {
            "content": {"type": "array", "items": logprob_entry()},
            "refusal": {"type": "null"},
        },
    }


def _completion(object_name: str, choice: dict) -> dict:
    return json_object(
        {
            "id": {"type": "string"},
            "object": {"const": object_name},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "system_fingerprint": {"type": ["string", "null"]},
            "service_tier": {"type": "null"},
            "choices": {"type": "array", "items": choice},
            "usage": ref("Usage")
            if object_name == "chat.completion"
            else {"anyOf": [ref("Usage"), {"type": "null"}]},
        },
        required=("id", "object", "created", "model", "choices"),
        closed=False,
    )


def schemas() -> dict:
    finish = {"type": ["string", "null"], "examples": ["stop", "length", "tool_calls"]}
    delta = json_object(
        {
            "role": {"const": "assistant"},
            "content": {"type": "string"},
            "tool_calls": {
                "type": "array",
                "items": json_object(
                    {
                        "index": {"type": "integer"},
                        "id": {"type": "string"},
                        "type": {"const": "function"},
                        "function": json_object(
                            {"name": {"type": "string"}, "arguments": {"type": "string"}},
                            closed=False,
                        ),
                    },
                    required=("index",),
                    closed=False,
                ),
            },
        },
        closed=False,
    )
    return {
        "CreateChatCompletionRequest": request(),
        "ChatCompletion": _completion(
            "chat.completion",
            json_object(
                {
                    "index": {"type": "integer"},
                    "message": _choice_message(),
                    "logprobs": _logprobs(),
                    "finish_reason": finish,
                },
                required=("index", "message", "finish_reason"),
                closed=False,
            ),
        ),
        "ChatCompletionChunk": _completion(
            "chat.completion.chunk",
            json_object(
                {
                    "index": {"type": "integer"},
                    "delta": delta,
                    "logprobs": _logprobs(),
                    "finish_reason": finish,
                },
                required=("index", "delta"),
                closed=False,
            ),
        ),
    }


PATHS = {
    "/chat/completions": {
        "post": {
            "operationId": "createChatCompletion",
            "summary": "Chat completion",
            "description": "OpenAI's chat completions: text, tool calls and JSON output (by guided "
            "decoding on our engine), streamed or whole.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("CreateChatCompletionRequest")}},
            },
            "responses": {
                "200": generation_answer("ChatCompletion", "ChatCompletionChunk"),
                **error_responses("400", "404", "429", "504"),
            },
        }
    }
}
