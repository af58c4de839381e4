"""GET /v1/models and GET /v1/models/{model}: the models the key's agent may use that
something can serve now (routing/services/catalog.py)."""

from __future__ import annotations

from routing.openapi.common import answer, error_responses, json_object, ref

MODEL = json_object(
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "max_model_len": {
            "type": "integer",
            "minimum": 1,
            "description": "vLLM's field: the context, in tokens (where it is known).",
        },
    },
    required=("id", "object", "created", "owned_by"),
)


def schemas() -> dict:
    return {
        "Model": MODEL,
        "ModelList": json_object(
            {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
            required=("object", "data"),
        ),
    }


PATHS = {
    "/models": {
        "get": {
            "operationId": "listModels",
            "summary": "The models this key may use",
            "responses": {
                "200": answer(
                    "The models, by name.", {"application/json": {"schema": ref("ModelList")}}
                ),
                **error_responses(),
            },
        }
    },
    "/models/{model}": {
        "get": {
            "operationId": "retrieveModel",
            "summary": "One model",
            "parameters": [
                {
                    "name": "model",
                    "in": "path",
                    "required": True,
                    "description": "The model's name (it may hold '/').",
                    "schema": {"type": "string", "minLength": 1},
                }
            ],
            "responses": {
                "200": answer("The model.", {"application/json": {"schema": ref("Model")}}),
                **error_responses("404"),
            },
        }
    },
}
