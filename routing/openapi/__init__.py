"""The OpenAPI 3.1 document of the /v1 API (served at /v1/openapi.json, with Swagger UI at
/api/docs/v1/): the part of OpenAI's specification Fairlane serves, as the parsers in
routing/wire/ accept it and its renderers answer, with the error body and every status an
operation can answer.

One module per section, each with `PATHS` (paths relative to the server URL `/v1`, as in
OpenAI's own document) and `schemas()` (its components); `common.py` holds what they share
(the key, the error responses and headers, usage, schema helpers). To add a front door (the
Responses API, Anthropic's Messages at /v1/messages), write `routing/openapi/<door>.py` with
its PATHS and schemas() and add it to SECTIONS below; an Anthropic door brings its own error
body and responses in its module (its errors are not OpenAI's shape). tests/platform/
test_v1_schema.py then checks that the whole is valid OpenAPI 3.1, that every route of
routing/urls.py is in it, and runs schemathesis over it against a live server.
"""

from __future__ import annotations

from functools import cache

from routing.openapi import (
    batches,
    chat,
    common,
    completions,
    embeddings,
    files,
    messages,
    models,
    responses,
)

SECTIONS = (models, chat, completions, embeddings, messages, responses, files, batches)
INFO = {
    "title": "Fairlane /v1 API",
    "version": "1",
    "description": (
        "OpenAI-compatible inference: chat and text completions (streamed as server-sent "
        "events, or whole) and embeddings, with an API key of the `inference` scope. The "
        "official OpenAI SDKs work unmodified with `base_url=<server>/v1`. Anthropic's "
        "Messages API is served at `/v1/messages` (its SDKs with `base_url=<server>`; its "
        "own error body there).\n\n"
        'Every error is OpenAI\'s body, `{"error": {"message", "type", "code", '
        '"param"}}`. A stream that fails after its first chunk ends with an event holding '
        "that body, then `data: [DONE]`.\n\n"
        "The same requests stream over a websocket at `/ws/v1/chat` (not described here: "
        'OpenAPI has no websockets): frames `{"type": "chat.completions" | '
        '"completions", "id", "body"}`, answered by `chunk`, `done` and `error` '
        "frames; see docs/api.md."
    ),
}


@cache
def document() -> dict:
    """The whole document (built once per process; it depends on code only)."""
    parts = common.components()
    paths: dict = {}
    for section in SECTIONS:
        overlap = set(paths) & set(section.PATHS)
        assert not overlap, f"{section.__name__} repeats {overlap}"
        paths |= section.PATHS
        parts["schemas"] |= section.schemas()
    return {
        "openapi": "3.1.0",
        "info": INFO,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "servers": [{"url": "/v1"}],
        "security": [{"apiKey": []}],
        "paths": paths,
        "components": parts,
    }
