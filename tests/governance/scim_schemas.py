"""JSON Schemas for SCIM resources, built from the RFC 7643 section 8.7.1 schema definitions
(User, Group) that django-scim2 ships, plus the common attributes (RFC 7643 section 3.1) and
the ListResponse and Error messages (RFC 7644 sections 3.4.2 and 3.12)."""

import json
from importlib import resources

TYPES = {
    "string": "string",
    "boolean": "boolean",
    "decimal": "number",
    "integer": "integer",
    "dateTime": "string",
    "reference": "string",
    "binary": "string",
}


def _attribute(attr: dict) -> dict:
    if attr["type"] == "complex":
        schema = {
            "type": "object",
            "properties": {a["name"]: _attribute(a) for a in attr.get("subAttributes", [])},
        }
    else:
        schema = {"type": TYPES[attr["type"]]}
        if attr["type"] == "dateTime":
            schema["format"] = "date-time"
        if attr.get("canonicalValues") and attr["type"] == "string" and attr["name"] == "type":
            schema = {"type": "string"}  # canonical values are suggestions ("SHOULD")
    return {"type": "array", "items": schema} if attr.get("multiValued") else schema


def resource_schema(name: str) -> dict:
    definition = json.loads(
        resources.files("django_scim.schemas.core").joinpath(f"{name}.json").read_text()
    )
    properties = {a["name"]: _attribute(a) for a in definition["attributes"]}
    required = [a["name"] for a in definition["attributes"] if a.get("required")]
    properties.update(
        {
            "schemas": {
                "type": "array",
                "items": {"type": "string"},
                "contains": {"const": definition["id"]},
            },
            "id": {"type": "string", "minLength": 1},
            "externalId": {"type": "string"},
            "meta": {
                "type": "object",
                "required": ["resourceType", "location"],
                "properties": {
                    "resourceType": {"const": name},
                    "created": {"type": "string", "format": "date-time"},
                    "lastModified": {"type": "string", "format": "date-time"},
                    "location": {"type": "string", "format": "uri"},
                },
            },
        }
    )
    return {
        "type": "object",
        "properties": properties,
        "required": ["schemas", "id", "meta", *required],
    }


LIST_RESPONSE = {
    "type": "object",
    "required": ["schemas", "totalResults", "Resources"],
    "properties": {
        "schemas": {"const": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"]},
        "totalResults": {"type": "integer", "minimum": 0},
        "startIndex": {"type": "integer", "minimum": 1},
        "itemsPerPage": {"type": "integer", "minimum": 0},
        "Resources": {"type": "array"},
    },
}
ERROR = {
    "type": "object",
    "required": ["schemas", "status"],
    "properties": {
        "schemas": {"const": ["urn:ietf:params:scim:api:messages:2.0:Error"]},
        "status": {"type": "string", "pattern": "^[45][0-9][0-9]$"},
        "scimType": {"type": "string"},
        "detail": {"type": "string"},
    },
}
