"""The prompt of an Anthropic Messages request as routing/wire/anthropic_messages.py and
anthropic.py take it: its messages and content blocks, system, tools, tool_choice, thinking,
cache_control and output_config (shared by /v1/messages and its count_tokens)."""

from __future__ import annotations

from routing.openapi.common import boolean, json_object, nullable
from routing.wire.anthropic import EFFORTS
from routing.wire.anthropic_messages import THINKING_TYPES
from routing.wire.messages import IMAGE_TYPES, TOOL_CALL_ID
from routing.wire.tools import MAX_TOOLS, NAME

CACHE_CONTROL = nullable(
    json_object(
        {"type": {"const": "ephemeral"}, "ttl": {"enum": ["5m", "1h"]}},
        required=("type",),
        closed=False,
        description="Prompt caching: passed to an Anthropic backend; elsewhere it changes nothing.",
    )
)
TEXT = json_object(
    {
        "type": {"const": "text"},
        "text": {"type": "string"},
        "cache_control": CACHE_CONTROL,
        "citations": nullable({"type": "array"}),
    },
    required=("type", "text"),
)
IMAGE = json_object(
    {
        "type": {"const": "image"},
        "source": {
            "oneOf": [
                json_object(
                    {
                        "type": {"const": "base64"},
                        "media_type": {"enum": list(IMAGE_TYPES)},
                        "data": {"type": "string", "contentEncoding": "base64"},
                    },
                    required=("type", "media_type", "data"),
                    closed=False,
                ),
                json_object(
                    {"type": {"const": "url"}, "url": {"type": "string", "format": "uri"}},
                    required=("type", "url"),
                    closed=False,
                ),
            ]
        },
        "cache_control": CACHE_CONTROL,
    },
    required=("type", "source"),
    description="Only for models with a backend that takes images (a 400 otherwise).",
)
TOOL_USE = json_object(
    {
        "type": {"const": "tool_use"},
        "id": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "input": {"type": "object"},
        "cache_control": CACHE_CONTROL,
    },
    required=("type", "id", "name", "input"),
)
TOOL_RESULT = json_object(
    {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string", "pattern": f"^{TOOL_CALL_ID.pattern}$"},
        "content": nullable(
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [TEXT, IMAGE]}}]}
        ),
        "is_error": boolean(),
        "cache_control": CACHE_CONTROL,
    },
    required=("type", "tool_use_id"),
)
THINKING = json_object(
    {
        "type": {"const": "thinking"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
    },
    required=("type", "thinking", "signature"),
    description="Passed to an Anthropic backend; left out for any other.",
)
REDACTED = json_object(
    {"type": {"const": "redacted_thinking"}, "data": {"type": "string"}},
    required=("type", "data"),
)


def _message(role: str, blocks: list[dict]) -> dict:
    return json_object(
        {
            "role": {"const": role},
            "content": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": blocks}}]
            },
        },
        required=("role", "content"),
    )


def _tool_choice() -> dict:
    parallel = boolean("One tool call at most.")
    return nullable(
        {
            "oneOf": [
                json_object(
                    {
                        "type": {"enum": ["auto", "any", "none"]},
                        "disable_parallel_tool_use": parallel,
                    },
                    required=("type",),
                ),
                json_object(
                    {
                        "type": {"const": "tool"},
                        "name": {"type": "string"},
                        "disable_parallel_tool_use": parallel,
                    },
                    required=("type", "name"),
                    description="Must name one of `tools`.",
                ),
            ]
        }
    )


def prompt_properties() -> dict:
    """What a request and a count share: the prompt, the tools, the output's format."""
    tool = json_object(
        {
            "type": {"const": "custom"},
            "name": {"type": "string", "pattern": f"^{NAME.pattern}$"},
            "description": nullable({"type": "string"}),
            "input_schema": {"type": "object", "description": "A JSON Schema."},
            "cache_control": CACHE_CONTROL,
        },
        required=("name", "input_schema"),
    )
    return {
        "model": {"type": "string", "minLength": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "oneOf": [
                    _message("user", [TEXT, IMAGE, TOOL_RESULT]),
                    _message("assistant", [TEXT, TOOL_USE, THINKING, REDACTED]),
                ]
            },
        },
        "system": nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT}]}),
        "tools": nullable(
            {
                "type": "array",
                "maxItems": MAX_TOOLS,
                "uniqueItems": True,
                "items": tool,
                "description": "Names must be unique.",
            }
        ),
        "tool_choice": _tool_choice(),
        "thinking": nullable(
            json_object(
                {"type": {"enum": sorted(THINKING_TYPES)}},
                required=("type",),
                closed=False,
                description="Passed to an Anthropic backend; elsewhere it changes nothing.",
            )
        ),
        "cache_control": CACHE_CONTROL,
        "output_config": nullable(
            json_object(
                {
                    "effort": nullable({"enum": sorted(EFFORTS)}),
                    "format": nullable(
                        json_object(
                            {"type": {"const": "json_schema"}, "schema": {"type": "object"}},
                            required=("type", "schema"),
                            closed=False,
                            description="The answer is JSON of this schema (guided decoding "
                            "on our engine).",
                        )
                    ),
                }
            )
        ),
    }
