"""What every /v1 operation shares: the key, the error body and the statuses that carry it,
the response headers, usage, and JSON Schema helpers. The sections (chat.py, ...) build
their operations from these."""

from __future__ import annotations

SCHEMA = "#/components/schemas/"
HEADERS = "#/components/headers/"
RESPONSES = "#/components/responses/"


def ref(name: str) -> dict:
    return {"$ref": SCHEMA + name}


def nullable(schema: dict) -> dict:
    """`schema` or null (the parsers read an explicit null as absent, as OpenAI's do)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def integer(low: int, high: int, description: str = "") -> dict:
    return nullable(
        {
            "type": "integer",
            "minimum": low,
            "maximum": high,
            **({"description": description} if description else {}),
        }
    )


def number(low: float, high: float, *, low_open: bool = False, description: str = "") -> dict:
    bound = {"exclusiveMinimum": low} if low_open else {"minimum": low}
    return nullable(
        {
            "type": "number",
            **bound,
            "maximum": high,
            **({"description": description} if description else {}),
        }
    )


def boolean(description: str = "") -> dict:
    return nullable({"type": "boolean", **({"description": description} if description else {})})


def string(description: str = "", **bounds) -> dict:
    return nullable(
        {"type": "string", **bounds, **({"description": description} if description else {})}
    )


# A parameter accepted only at a neutral value: absent, null, or (for the deprecated ones
# OpenAI's clients may still send empty) anything JSON calls falsy.
NEUTRAL = {"type": "null", "description": "Not supported by this server: absent or null only."}
FALSY = {
    "enum": [None, False, 0, "", [], {}],
    "deprecated": True,
    "description": "Not supported by this server: absent, or an empty or false value.",
}


def json_object(
    properties: dict,
    *,
    required: tuple[str, ...] = (),
    description: str = "",
    closed: bool = True,
    **extra,
) -> dict:
    """An object; `closed`: an unknown key is a 400 (as OpenAI's API answers one)."""
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    if description:
        schema["description"] = description
    return schema


# What each status of a /v1 answer means, with the error codes it carries.
STATUSES = {
    "400": (
        "The request is invalid: unparseable or not a JSON object, an unknown or "
        "malformed parameter, a body over the size limit, a prompt over the model's "
        "context (`context_length_exceeded`), or a feature no backend of the model "
        "supports. `param` names the parameter where there is one.",
        ("invalid_request", "context_length_exceeded", "content_filtered"),
    ),
    "401": ("No API key, or an incorrect, expired or revoked one.", ("authentication",)),
    "403": ("The key lacks the `inference` scope.", ("permission",)),
    "404": (
        "The model does not exist or the key's agent may not use it; or the file or batch "
        "named (in the path, or as `after` or `input_file_id`) is not one of the key's tenant.",
        ("model_not_found", "not_found"),
    ),
    "413": (
        "An upload over the server's file size limit (`file_too_large`) or past the tenant's "
        "storage quota (`storage_quota_exceeded`); the message names the limit.",
        ("file_too_large", "storage_quota_exceeded"),
    ),
    "429": (
        "A rate limit (`rate_limited`, with Retry-After) or the budget window is spent "
        "(`budget_exhausted`, type `insufficient_quota`, with x-should-retry: false).",
        ("rate_limited", "budget_exhausted"),
    ),
    "500": ("A fault of ours (logged with the request's trace id).", ("internal_error",)),
    "503": (
        "Overloaded, no backend available, a circuit open, or one of our stores briefly "
        "unavailable; Retry-After says when retrying helps.",
        ("overloaded", "backend_unavailable", "circuit_open", "service_unavailable"),
    ),
    "504": ("The backend did not answer in time.", ("timeout",)),
}
# Statuses every operation of the API can answer, whatever it is asked.
EVERY_OPERATION = ("401", "403", "500", "503")


def error_responses(*statuses: str) -> dict:
    """The error responses of an operation: EVERY_OPERATION's and `statuses`."""
    return {
        status: {"$ref": f"{RESPONSES}{status}"} for status in sorted({*EVERY_OPERATION, *statuses})
    }


def answer(description: str, content: dict, *, headers: tuple[str, ...] = ()) -> dict:
    """A successful response: its content and the headers every /v1 answer carries."""
    return {
        "description": description,
        "content": content,
        "headers": {name: {"$ref": HEADERS + name} for name in ("x-fairlane-trace-id", *headers)},
    }


def components() -> dict:
    """The shared components: the error body, its responses, headers, usage, security."""
    error_codes = sorted({code for _, codes in STATUSES.values() for code in codes})
    responses = {}
    for status, (description, codes) in STATUSES.items():
        headers = {
            "x-fairlane-trace-id": {
                "description": "The request's trace id; absent when no route matched the path.",
                "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            }
        }
        if status in ("429", "503"):
            headers["Retry-After"] = {"$ref": HEADERS + "Retry-After"}
        if status == "401":
            headers["WWW-Authenticate"] = {"$ref": HEADERS + "WWW-Authenticate"}
        responses[status] = {
            "description": f"{description} Codes: {', '.join(f'`{c}`' for c in codes)}.",
            "headers": headers,
            "content": {"application/json": {"schema": ref("ErrorResponse")}},
        }
    return {
        "securitySchemes": {
            "apiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key with the `inference` scope: `Authorization: Bearer "
                "fl-...`. Keys are made in the portal or the management API.",
            }
        },
        "headers": {
            "x-fairlane-trace-id": {
                "description": "The request's trace id (32 hex digits).",
                "required": True,
                "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            },
            "x-request-id": {
                "description": "The request's id, as in the usage ledger.",
                "required": True,
                "schema": {"type": "string"},
            },
            "Retry-After": {
                "description": "Seconds after which retrying may succeed.",
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
            },
            "WWW-Authenticate": {"required": True, "schema": {"type": "string"}},
        },
        "responses": responses,
        "schemas": {
            "ErrorResponse": json_object(
                {
                    "error": json_object(
                        {
                            "message": {"type": "string"},
                            "type": {"type": "string", "examples": ["invalid_request_error"]},
                            "code": {
                                "type": "string",
                                "examples": error_codes,
                                "description": "Stable and machine-readable: "
                                + ", ".join(error_codes)
                                + ".",
                            },
                            "param": {
                                "type": ["string", "null"],
                                "description": "The parameter at fault, as `messages[0].content`.",
                            },
                        },
                        required=("message", "type", "code", "param"),
                    )
                },
                required=("error",),
                description="OpenAI's error body; also the data of an SSE event that ends a "
                "stream after its first chunk.",
            ),
            "Usage": json_object(
                {
                    "prompt_tokens": {"type": "integer", "minimum": 0},
                    "completion_tokens": {"type": "integer", "minimum": 0},
                    "total_tokens": {"type": "integer", "minimum": 0},
                    "prompt_tokens_details": json_object(
                        {"cached_tokens": {"type": "integer", "minimum": 0}},
                        required=("cached_tokens",),
                    ),
                },
                required=("prompt_tokens", "completion_tokens", "total_tokens"),
            ),
        },
    }
