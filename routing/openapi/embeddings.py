"""POST /v1/embeddings: inputs as routing/wire/parse.py takes them, the answer as
routing/wire/render.py writes it."""

from __future__ import annotations

from routing.openapi.common import (
    answer,
    error_responses,
    json_object,
    nullable,
    ref,
    string,
)
from routing.openapi.completions import inputs
from routing.wire.parse import MAX_BATCH_INPUTS


def embedding_request() -> dict:
    return json_object(
        {
            "model": {"type": "string", "minLength": 1},
            "input": inputs(
                f"A string, token ids, or a batch of up to {MAX_BATCH_INPUTS} of either."
            ),
            "encoding_format": nullable({"enum": ["float", "base64"]}),
            "dimensions": {
                "type": "null",
                "description": "Not supported (absent or null only): "
                "an embedding's size is the model's.",
            },
            "user": string(),
        },
        required=("model", "input"),
    )


def schemas() -> dict:
    return {
        "CreateEmbeddingRequest": embedding_request(),
        "EmbeddingList": json_object(
            {
                "object": {"const": "list"},
                "data": {
                    "type": "array",
                    "items": json_object(
                        {
                            "object": {"const": "embedding"},
                            "index": {"type": "integer"},
                            "embedding": {
                                "anyOf": [
                                    {"type": "array", "items": {"type": "number"}},
                                    {"type": "string", "contentEncoding": "base64"},
                                ]
                            },
                        },
                        required=("object", "index", "embedding"),
                    ),
                },
                "model": {"type": "string"},
                "usage": json_object(
                    {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
                    required=("prompt_tokens", "total_tokens"),
                ),
            },
            required=("object", "data", "model", "usage"),
        ),
    }


PATHS = {
    "/embeddings": {
        "post": {
            "operationId": "createEmbedding",
            "summary": "Embeddings",
            "description": "The mean-pooled last hidden states of our engine, or a remote "
            "backend's embeddings, unit length.",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("CreateEmbeddingRequest")}},
            },
            "responses": {
                "200": answer(
                    "The embeddings, in input order.",
                    {"application/json": {"schema": ref("EmbeddingList")}},
                ),
                **error_responses("400", "404", "429", "504"),
            },
        }
    },
}
