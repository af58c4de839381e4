"""/responses: OpenAI's Responses API as routing/wire/responses.py takes it (input items,
function tools, `text.format`, stored responses and their chains) and
routing/wire/responses_render.py answers it (the response object, its semantic events)."""

from __future__ import annotations

from routing.openapi.chat import NAMED
from routing.openapi.common import (
    answer,
    boolean,
    error_responses,
    integer,
    json_object,
    nullable,
    number,
    ref,
    string,
)
from routing.openapi.sampling import MAX_TOKENS
from routing.wire.messages import DETAILS, TOOL_CALL_ID
from routing.wire.response_items import PARTS
from routing.wire.responses import MAX_METADATA
from routing.wire.tools import MAX_TOOLS

CALL_ID = {"type": "string", "pattern": f"^{TOOL_CALL_ID.pattern}$"}
ONLY_NULL = {"type": "null", "description": "Not supported by this server: absent or null only."}
PART_SCHEMAS = {
    "input_text": json_object(
        {"type": {"const": "input_text"}, "text": {"type": "string"}},
        required=("type", "text"),
        closed=False,
    ),
    "output_text": json_object(
        {"type": {"const": "output_text"}, "text": {"type": "string"}},
        required=("type", "text"),
        closed=False,
    ),
    "refusal": json_object(
        {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
        required=("type", "refusal"),
        closed=False,
    ),
    "input_image": json_object(
        {
            "type": {"const": "input_image"},
            "image_url": {
                "type": "string",
                "minLength": 1,
                "description": "http(s) (up to 2048 characters), or a base64 data URL of a "
                "PNG, JPEG, GIF or WebP image.",
            },
            "detail": nullable({"enum": sorted(DETAILS)}),
            "file_id": ONLY_NULL,
        },
        required=("type", "image_url"),
        closed=False,
        description="Only for models with a backend that takes images (a 400 otherwise).",
    ),
}


def _message(roles: list[str]) -> dict:
    parts = PARTS[roles[0]]
    items = (
        PART_SCHEMAS[parts[0]] if len(parts) == 1 else {"anyOf": [PART_SCHEMAS[p] for p in parts]}
    )
    return json_object(
        {
            "type": {"const": "message"},
            "role": {"enum": roles},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": items}]},
        },
        required=("role", "content"),
        closed=False,
    )


FUNCTION_CALL = json_object(
    {
        "type": {"const": "function_call"},
        "call_id": CALL_ID,
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": "string", "description": "JSON, as the model wrote it."},
    },
    required=("type", "call_id", "name", "arguments"),
    closed=False,
)
FUNCTION_CALL_OUTPUT = json_object(
    {
        "type": {"const": "function_call_output"},
        "call_id": CALL_ID,
        "output": {"type": "string"},
    },
    required=("type", "call_id", "output"),
    closed=False,
)
INPUT_ITEM = {
    "anyOf": [
        _message(["user"]),
        _message(["system", "developer"]),
        _message(["assistant"]),
        FUNCTION_CALL,
        FUNCTION_CALL_OUTPUT,
    ]
}
TOOL = json_object(
    {
        "type": {"const": "function"},
        "name": NAMED,
        "description": nullable({"type": "string"}),
        "parameters": nullable({"type": "object", "description": "A JSON Schema."}),
        "strict": boolean(),
    },
    required=("type", "name"),
    description="Function tools only: hosted tools (web search, file search, ...) are a 400.",
)
FORMAT = {
    "oneOf": [
        json_object({"type": {"const": "text"}}, required=("type",)),
        json_object({"type": {"const": "json_object"}}, required=("type",)),
        json_object(
            {
                "type": {"const": "json_schema"},
                "name": NAMED,
                "description": nullable({"type": "string"}),
                "schema": nullable({"type": "object", "description": "A JSON Schema."}),
                "strict": boolean(),
            },
            required=("type", "name"),
        ),
        {"type": "null"},
    ]
}
TOOL_CHOICE = nullable(
    {
        "anyOf": [
            {"enum": ["none", "auto", "required"]},
            json_object(
                {"type": {"const": "function"}, "name": NAMED},
                required=("type", "name"),
                description="Must name one of `tools`.",
            ),
        ]
    }
)


def request() -> dict:
    properties = {
        "model": {
            "type": "string",
            "minLength": 1,
            "description": "A model the key's agent may use (GET /v1/models).",
        },
        "input": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": INPUT_ITEM},
            ],
            "description": "A user message's text, or items.",
        },
        "instructions": string("The system turn; not carried along a chain."),
        "previous_response_id": string(
            "A stored response of the key's tenant: its conversation and output come first."
        ),
        "max_output_tokens": integer(1, MAX_TOKENS, "Default: what the model's context leaves."),
        "temperature": number(0, 2),
        "top_p": number(0, 1, low_open=True),
        "tools": nullable({"type": "array", "maxItems": MAX_TOOLS, "items": TOOL}),
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": boolean(),
        "text": nullable(
            json_object({"format": FORMAT, "verbosity": nullable({"const": "medium"})})
        ),
        "metadata": nullable(
            {
                "type": "object",
                "maxProperties": MAX_METADATA,
                "propertyNames": {"maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 512},
            }
        ),
        "user": string("The end user, for the caller's own records."),
        "safety_identifier": string("Accepted and kept for the caller's own records."),
        "prompt_cache_key": string("Accepted; caching is per tenant whatever it says."),
        "store": boolean("Keep the response (the default) for retrieval and chaining."),
        "stream": boolean("Stream the response's events as server-sent events."),
        "stream_options": nullable(
            json_object({"include_obfuscation": boolean()}, description="Only with `stream`.")
        ),
        "max_tool_calls": integer(1, 1_000_000),
        "truncation": nullable({"const": "disabled"}),
        "include": nullable({"type": "array", "maxItems": 0}),
        "reasoning": nullable({"type": "object", "maxProperties": 0}),
        "background": nullable({"const": False}),
        "service_tier": nullable({"enum": ["auto", "default"]}),
        "top_logprobs": nullable({"const": 0}),
        "prompt": ONLY_NULL,
        "conversation": ONLY_NULL,
    }
    return json_object(
        properties,
        required=("model", "input"),
        allOf=[
            {
                "if": {
                    "required": ["stream_options"],
                    "properties": {"stream_options": {"type": "object"}},
                },
                "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
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


OUTPUT_ITEM = json_object(
    {
        "id": {"type": "string"},
        "type": {"enum": ["message", "function_call"]},
        "status": {"enum": ["in_progress", "completed", "incomplete"]},
    },
    required=("id", "type"),
    closed=False,
    description="A message (role assistant, output_text content) or a function_call "
    "(call_id, name, arguments).",
)


def _response() -> dict:
    return json_object(
        {
            "id": {"type": "string", "pattern": "^resp_"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": {"enum": ["in_progress", "completed", "incomplete", "failed"]},
            "error": {"type": ["object", "null"]},
            "incomplete_details": {"type": ["object", "null"]},
            "model": {"type": "string"},
            "output": {"type": "array", "items": OUTPUT_ITEM},
            "previous_response_id": {"type": ["string", "null"]},
            "usage": {
                "anyOf": [
                    json_object(
                        {
                            "input_tokens": {"type": "integer", "minimum": 0},
                            "input_tokens_details": json_object(
                                {"cached_tokens": {"type": "integer", "minimum": 0}},
                                required=("cached_tokens",),
                                closed=False,
                            ),
                            "output_tokens": {"type": "integer", "minimum": 0},
                            "total_tokens": {"type": "integer", "minimum": 0},
                        },
                        required=("input_tokens", "output_tokens", "total_tokens"),
                        closed=False,
                    ),
                    {"type": "null"},
                ]
            },
        },
        required=("id", "object", "created_at", "status", "model", "output"),
        closed=False,
    )


def schemas() -> dict:
    return {
        "CreateResponseRequest": request(),
        "Response": _response(),
        "ResponseStreamEvent": json_object(
            {"type": {"type": "string"}, "sequence_number": {"type": "integer", "minimum": 0}},
            required=("type", "sequence_number"),
            closed=False,
            description="response.created, response.in_progress, "
            "response.output_item.added, response.content_part.added, "
            "response.output_text.delta, response.function_call_arguments.delta and .done, "
            "response.output_text.done, response.content_part.done, "
            "response.output_item.done, then response.completed, response.incomplete or "
            "response.failed.",
        ),
        "DeletedResponse": json_object(
            {
                "id": {"type": "string"},
                "object": {"const": "response"},
                "deleted": {"const": True},
            },
            required=("id", "object", "deleted"),
        ),
        "ResponseItemList": json_object(
            {
                "object": {"const": "list"},
                "data": {"type": "array", "items": {"type": "object", "required": ["id"]}},
                "first_id": {"type": ["string", "null"]},
                "last_id": {"type": ["string", "null"]},
                "has_more": {"type": "boolean"},
            },
            required=("object", "data", "has_more"),
        ),
    }


EVENT_STREAM = {
    "schema": {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": ref("ResponseStreamEvent"),
            },
        },
        "description": "A server-sent event: `event: <type>` and `data: <the event as JSON>`.",
    }
}
RESPONSE_ID = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "description": "The response's id (`resp_...`).",
    "schema": {"type": "string", "minLength": 1},
}


def _json(description: str, schema: str) -> dict:
    return answer(description, {"application/json": {"schema": ref(schema)}})


PATHS = {
    "/responses": {
        "post": {
            "operationId": "createResponse",
            "summary": "Create a response",
            "description": "OpenAI's Responses API on every backend kind: text, function "
            "calls and JSON output, streamed as semantic events or whole; chained with "
            "`previous_response_id`.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("CreateResponseRequest")}},
            },
            "responses": {
                "200": answer(
                    "The response, or with `stream: true` its events. x-fairlane-backend names "
                    "the backend that answered.",
                    {
                        "application/json": {"schema": ref("Response")},
                        "text/event-stream": EVENT_STREAM,
                    },
                    headers=("x-request-id",),
                ),
                **error_responses("400", "404", "429", "504"),
            },
        }
    },
    "/responses/{response_id}": {
        "get": {
            "operationId": "getResponse",
            "summary": "A stored response",
            "parameters": [RESPONSE_ID],
            "responses": {
                "200": _json("The response as it was answered.", "Response"),
                **error_responses("404"),
            },
        },
        "delete": {
            "operationId": "deleteResponse",
            "summary": "Delete a stored response",
            "parameters": [RESPONSE_ID],
            "responses": {
                "200": _json("It is gone.", "DeletedResponse"),
                **error_responses("404"),
            },
        },
    },
    "/responses/{response_id}/input_items": {
        "get": {
            "operationId": "listInputItems",
            "summary": "A stored response's input items",
            "description": "The conversation it was sent (a chain's earlier turns too), "
            "without `instructions`.",
            "parameters": [
                RESPONSE_ID,
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                {
                    "name": "after",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "An item id: the page starts after it.",
                },
            ],
            "responses": {
                "200": _json("A page of items.", "ResponseItemList"),
                **error_responses("400", "404"),
            },
        }
    },
}
