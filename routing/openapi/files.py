"""/v1/files: OpenAI's Files API (routing/batches/apis.py)."""

from __future__ import annotations

from routing.openapi.common import answer, error_responses, json_object, ref

FILE = json_object(
    {
        "id": {"type": "string"},
        "object": {"const": "file"},
        "bytes": {"type": "integer", "minimum": 0},
        "created_at": {"type": "integer"},
        "expires_at": {"type": ["integer", "null"]},
        "filename": {"type": "string"},
        "purpose": {"enum": ["batch", "batch_output", "user_data"]},
        "status": {"const": "processed"},
        "status_details": {"type": "null"},
    },
    required=("id", "object", "bytes", "created_at", "filename", "purpose", "status"),
)
FILE_ID = {
    "name": "file_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
}


def _list(item: str) -> dict:
    return json_object(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref(item)},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        required=("object", "data", "has_more"),
    )


def schemas() -> dict:
    return {
        "OpenAIFile": FILE,
        "ListFilesResponse": _list("OpenAIFile"),
        "DeleteFileResponse": json_object(
            {"id": {"type": "string"}, "object": {"const": "file"}, "deleted": {"type": "boolean"}},
            required=("id", "object", "deleted"),
        ),
    }


def _json(name: str) -> dict:
    return {"application/json": {"schema": ref(name)}}


PATHS = {
    "/files": {
        "post": {
            "operationId": "createFile",
            "summary": "Upload a file (multipart; `purpose` batch or user_data)",
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "file": {"type": "string", "format": "binary"},
                                "purpose": {"enum": ["batch", "user_data"]},
                            },
                            "required": ["file", "purpose"],
                        }
                    }
                },
            },
            "responses": {
                "200": answer("The file.", _json("OpenAIFile")),
                **error_responses("400", "413"),
            },
        },
        "get": {
            "operationId": "listFiles",
            "summary": "The key's tenant's files, newest first",
            "parameters": [
                {"name": "purpose", "in": "query", "schema": {"type": "string"}},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
                },
                {"name": "after", "in": "query", "schema": {"type": "string"}},
                {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
            ],
            "responses": {
                "200": answer("A page of files.", _json("ListFilesResponse")),
                **error_responses("400", "404"),
            },
        },
    },
    "/files/{file_id}": {
        "get": {
            "operationId": "retrieveFile",
            "summary": "One file",
            "parameters": [FILE_ID],
            "responses": {
                "200": answer("The file.", _json("OpenAIFile")),
                **error_responses("404"),
            },
        },
        "delete": {
            "operationId": "deleteFile",
            "summary": "Delete a file and its bytes",
            "parameters": [FILE_ID],
            "responses": {
                "200": answer("Deleted.", _json("DeleteFileResponse")),
                **error_responses("404"),
            },
        },
    },
    "/files/{file_id}/content": {
        "get": {
            "operationId": "downloadFile",
            "summary": "The file's bytes",
            "parameters": [FILE_ID],
            "responses": {
                "200": answer(
                    "The bytes.",
                    {
                        "application/jsonl": {"schema": {"type": "string"}},
                        "application/octet-stream": {"schema": {"type": "string"}},
                    },
                ),
                **error_responses("404"),
            },
        }
    },
}
