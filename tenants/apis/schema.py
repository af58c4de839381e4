"""The management API's OpenAPI schema says what the API really answers: besides each
operation's success, every error status it can return, in the OpenAI error shape
(`{"error": {"message", "type", "code", "param"}}`), so generated clients parse them.

- 400: bad JSON, wrong types, unknown fields, out-of-range values, bad query parameters
- 401: no or bad credentials; 403: the role or the key's scopes do not allow it
- 404: no such object (also a tenant you are not in, exactly like one that does not exist)
- 409: the write lost a race with a deletion; 415: a body that is not JSON
"""

from django.core.validators import RegexValidator
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from tenants.apis.serializers import StrictSerializer

DESCRIPTIONS = {
    400: "Invalid request: malformed JSON, a wrong type, an unknown field or an out-of-range "
    "value (`param` names it).",
    401: "No credentials, or a key or session that is not valid.",
    403: "Your role in the tenant, or the key's scopes, do not allow this.",
    404: "No such object, or a tenant you are not a member of.",
    409: "The write conflicts with a concurrent change; read again and retry.",
    415: "The body must be JSON (Content-Type: application/json).",
}


class ErrorDetailOut(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField()
    code = serializers.CharField(
        help_text="Stable, machine-readable: e.g. invalid_request, "
        "authentication, permission, not_found, conflict."
    )
    param = serializers.CharField(allow_null=True, help_text="The parameter at fault, if any.")


class ErrorOut(serializers.Serializer):
    error = ErrorDetailOut()


# Some character that str.strip() keeps (Python's whitespace, spelled out, so that every
# regex engine reads it the same).
NOT_ONLY_WHITESPACE = (
    "[^\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680"
    "\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
)


def error_statuses(method: str) -> list[int]:
    statuses = [400, 401, 403, 404]
    if method in {"POST", "PUT", "PATCH", "DELETE"}:
        statuses.append(409)
    if method in {"POST", "PUT", "PATCH"}:
        statuses.append(415)
    return statuses


class FairlaneAutoSchema(AutoSchema):
    """drf-spectacular's schema, with the error responses of every operation, and request
    bodies that say they take no other fields (the strict serializers refuse them)."""

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (
            direction == "request"
            and isinstance(field, serializers.CharField)
            and field.trim_whitespace
            and not field.allow_blank
            and schema.get("type") == "string"
            and "pattern" not in schema
            and "enum" not in schema
            and "format" not in schema
            and not any(isinstance(v, RegexValidator) for v in field.validators)
        ):
            schema["pattern"] = NOT_ONLY_WHITESPACE  # DRF strips it, then refuses blanks
        return schema

    def _map_serializer(self, serializer, direction, bypass_extensions=False):
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for status in error_statuses(self.method):
            if str(status) not in responses:
                response = self._get_response_for_code(ErrorOut, str(status), direction=direction)
                response["description"] = DESCRIPTIONS[status]
                responses[str(status)] = response
        return responses
