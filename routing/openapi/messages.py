"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as routing/wire/
anthropic.py and anthropic_messages.py take it, the answer as anthropic_render.py writes it,
and Anthropic's error body (`{"type": "error", "error": {"type", "message"}}`) with its
statuses (529 for overloaded)."""

from __future__ import annotations

from routing.openapi.common import HEADERS, boolean, integer, json_object, nullable, number, ref
from routing.openapi.messages_prompt import prompt_properties
from routing.wire.anthropic import MAX_STOP_SEQUENCES, MAX_TOKENS
from routing.wire.anthropic_render import ERROR_TYPES


def _request() -> dict:
    return json_object(
        {
            **prompt_properties(),
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS},
            "stop_sequences": nullable(
                {
                    "type": "array",
                    "maxItems": MAX_STOP_SEQUENCES,
                    "items": {"type": "string", "minLength": 1},
                }
            ),
            "temperature": number(0.0, 1.0),
            "top_p": number(0.0, 1.0, low_open=True),
            "top_k": integer(0, 1_000_000),
            "metadata": nullable(json_object({"user_id": nullable({"type": "string"})})),
            "stream": boolean(),
            "service_tier": nullable({"enum": ["auto", "standard_only"]}),
        },
        required=("model", "messages", "max_tokens"),
    )


def _answer() -> dict:
    block = {
        "anyOf": [
            json_object(
                {"type": {"const": "text"}, "text": {"type": "string"}}, required=("type", "text")
            ),
            json_object(
                {
                    "type": {"const": "tool_use"},
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "input": {"type": "object"},
                },
                required=("type", "id", "name", "input"),
            ),
        ]
    }
    count = {"type": "integer", "minimum": 0}
    return json_object(
        {
            "id": {"type": "string", "pattern": "^msg_"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": {"type": "string"},
            "content": {"type": "array", "items": block},
            "stop_reason": {"enum": ["end_turn", "max_tokens", "tool_use", None]},
            "stop_sequence": {"type": ["string", "null"]},
            "usage": json_object(
                {
                    "input_tokens": count,
                    "output_tokens": count,
                    "cache_creation_input_tokens": count,
                    "cache_read_input_tokens": count,
                },
                required=("input_tokens", "output_tokens"),
            ),
        },
        required=("id", "type", "role", "model", "content", "stop_reason", "usage"),
    )


def schemas() -> dict:
    return {
        "CreateMessageRequest": _request(),
        "CountMessageTokensRequest": json_object(
            prompt_properties(), required=("model", "messages")
        ),
        "Message": _answer(),
        "MessageTokensCount": json_object(
            {"input_tokens": {"type": "integer", "minimum": 0}}, required=("input_tokens",)
        ),
        "AnthropicErrorResponse": json_object(
            {
                "type": {"const": "error"},
                "error": json_object(
                    {
                        "type": {"enum": sorted({*ERROR_TYPES.values(), "api_error"})},
                        "message": {"type": "string"},
                    },
                    required=("type", "message"),
                ),
            },
            required=("type", "error"),
            description="Anthropic's error body; also the data of an `error` event that ends a "
            "stream after its first event.",
        ),
    }


STATUSES = {
    "400": "The request is invalid (`invalid_request_error`), its prompt over the context too.",
    "401": "No API key, or an incorrect, expired or revoked one (`authentication_error`).",
    "403": "The key lacks the `inference` scope (`permission_error`).",
    "404": "The model does not exist or the key's agent may not use it (`not_found_error`).",
    "429": "A rate limit, or the budget window is spent (`rate_limit_error`).",
    "500": "A fault of ours (`api_error`).",
    "503": "No backend available, or one of our stores briefly unavailable "
    "(`overloaded_error`, with Retry-After).",
    "504": "The backend did not answer in time (`timeout_error`).",
    "529": "Overloaded: retry after Retry-After (`overloaded_error`).",
}


def _errors() -> dict:
    out = {}
    for status, description in STATUSES.items():
        headers = {"x-fairlane-trace-id": {"$ref": HEADERS + "x-fairlane-trace-id"}}
        if status in ("429", "503", "529"):
            headers["Retry-After"] = {"$ref": HEADERS + "Retry-After"}
        out[status] = {
            "description": description,
            "headers": headers,
            "content": {"application/json": {"schema": ref("AnthropicErrorResponse")}},
        }
    return out


def _event_stream() -> dict:
    return {
        "schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {
                    "enum": [
                        "message_start",
                        "ping",
                        "content_block_start",
                        "content_block_delta",
                        "content_block_stop",
                        "message_delta",
                        "message_stop",
                        "error",
                    ]
                },
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "description": "Anthropic's named events, in its order.",
        },
    }


def _operation(operation_id: str, summary: str, request: str, ok: dict) -> dict:
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "description": "Anthropic's Messages API (its SDKs work unmodified with "
            "`base_url=<server>`). The key goes as `x-api-key` or `Authorization: Bearer`; "
            "`anthropic-version` is accepted, whatever its value.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(request)}},
            },
            "responses": {"200": ok, **_errors()},
        }
    }


PATHS = {
    "/messages": _operation(
        "createMessage",
        "Message (Anthropic)",
        "CreateMessageRequest",
        {
            "description": "The whole message, or with `stream: true` Anthropic's event stream.",
            "content": {
                "application/json": {"schema": ref("Message")},
                "text/event-stream": _event_stream(),
            },
            "headers": {
                name: {"$ref": HEADERS + name} for name in ("x-fairlane-trace-id", "x-request-id")
            },
        },
    ),
    "/messages/count_tokens": _operation(
        "countMessageTokens",
        "Count a message's tokens (Anthropic)",
        "CountMessageTokensRequest",
        {
            "description": "The prompt's tokens: by the model's own tokenizer where the model "
            "is ours, else estimated.",
            "content": {"application/json": {"schema": ref("MessageTokensCount")}},
            "headers": {"x-fairlane-trace-id": {"$ref": HEADERS + "x-fairlane-trace-id"}},
        },
    ),
}
