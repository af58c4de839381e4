"""/v1/batches: OpenAI's Batch API (routing/batches/)."""

from __future__ import annotations

from routing.batch_models import BatchStatus
from routing.batches.endpoints import ENDPOINTS
from routing.openapi.common import answer, error_responses, json_object, ref
from routing.openapi.files import _list

NULLABLE_TIME = {"type": ["integer", "null"]}
BATCH = json_object(
    {
        "id": {"type": "string"},
        "object": {"const": "batch"},
        "endpoint": {"enum": list(ENDPOINTS)},
        "errors": {
            "anyOf": [
                {"type": "null"},
                json_object(
                    {
                        "object": {"const": "list"},
                        "data": {
                            "type": "array",
                            "items": json_object(
                                {
                                    "code": {"type": "string"},
                                    "message": {"type": "string"},
                                    "param": {"type": ["string", "null"]},
                                    "line": {"type": ["integer", "null"]},
                                }
                            ),
                        },
                    }
                ),
            ]
        },
        "input_file_id": {"type": ["string", "null"]},
        "completion_window": {"const": "24h"},
        "status": {"enum": list(BatchStatus.values)},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        **{
            f"{name}_at": NULLABLE_TIME
            for name in (
                "created",
                "in_progress",
                "expires",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
        "request_counts": json_object(
            {
                "total": {"type": "integer"},
                "completed": {"type": "integer"},
                "failed": {"type": "integer"},
            },
            required=("total", "completed", "failed"),
        ),
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    },
    required=("id", "object", "endpoint", "status", "completion_window", "created_at"),
)
BATCH_ID = {
    "name": "batch_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
}


def schemas() -> dict:
    return {
        "Batch": BATCH,
        "ListBatchesResponse": _list("Batch"),
        "CreateBatchRequest": json_object(
            {
                "input_file_id": {"type": "string"},
                "endpoint": {"enum": list(ENDPOINTS)},
                "completion_window": {"const": "24h"},
                "metadata": {
                    "type": ["object", "null"],
                    "maxProperties": 16,
                    "additionalProperties": {"type": "string", "maxLength": 512},
                },
            },
            required=("input_file_id", "endpoint", "completion_window"),
        ),
    }


def _json(name: str) -> dict:
    return {"application/json": {"schema": ref(name)}}


PATHS = {
    "/batches": {
        "post": {
            "operationId": "createBatch",
            "summary": "Run a file of requests on the bulk lane, at the batch price",
            "requestBody": {"required": True, "content": _json("CreateBatchRequest")},
            "responses": {
                "200": answer("The batch (validating).", _json("Batch")),
                **error_responses("400", "404"),
            },
        },
        "get": {
            "operationId": "listBatches",
            "summary": "The key's tenant's batches, newest first",
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                {"name": "after", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {
                "200": answer("A page of batches.", _json("ListBatchesResponse")),
                **error_responses("400", "404"),
            },
        },
    },
    "/batches/{batch_id}": {
        "get": {
            "operationId": "retrieveBatch",
            "summary": "One batch, its state and request_counts",
            "parameters": [BATCH_ID],
            "responses": {
                "200": answer("The batch.", _json("Batch")),
                **error_responses("404"),
            },
        }
    },
    "/batches/{batch_id}/cancel": {
        "post": {
            "operationId": "cancelBatch",
            "summary": "Stop the batch taking lines (cancelling, then cancelled)",
            "parameters": [BATCH_ID],
            "responses": {
                "200": answer("The batch.", _json("Batch")),
                **error_responses("400", "404"),
            },
        }
    },
}
