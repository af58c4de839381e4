"""SCIM requests carry a tenant's bearer token (`Authorization: Bearer scim-...`): it names
the tenant every read and write is scoped to. No session, no CSRF (a header cannot be forged
cross-site), and no request body is ever logged (it may hold people's details)."""

import json

from django.http import HttpResponse
from django_scim.constants import SCIM_CONTENT_TYPE, SchemaURI
from django_scim.middleware import SCIMAuthCheckMiddleware

from tenants.apis.auth import bearer_token
from tenants.errors import AuthenticationFailed
from tenants.services.scim_tokens import scim_token_authenticate


class ScimPrincipal:
    """request.user for a SCIM request: acts in its token's tenant only."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = id = None

    def __init__(self, token) -> None:
        self.scim_token = token

    def __str__(self) -> str:
        return f"SCIM token {self.scim_token.prefix}"


def _unauthorized(detail: str) -> HttpResponse:
    body = {"schemas": [SchemaURI.ERROR], "status": "401", "detail": detail}
    response = HttpResponse(json.dumps(body), content_type=SCIM_CONTENT_TYPE, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="fairlane-scim"'
    return response


class ScimTokenAuth(SCIMAuthCheckMiddleware):
    def process_request(self, request):
        token = bearer_token(request)
        if token is None:
            return _unauthorized("A SCIM bearer token is required.")
        try:
            scim_token = scim_token_authenticate(plain=token)
        except AuthenticationFailed as exc:
            return _unauthorized(exc.message)
        request.scim_tenant = scim_token.tenant
        request.user = ScimPrincipal(scim_token)
        return None

    def process_response(self, request, response):
        """RFC 7644 3.12: an error's `status` is a string; django-scim2 writes a number."""
        if (
            response.status_code >= 400
            and response.get("Content-Type", "").startswith(SCIM_CONTENT_TYPE)
            and response.content
        ):
            try:
                body = json.loads(response.content)
            except ValueError:
                return response
            if isinstance(body, dict) and isinstance(body.get("status"), int):
                body["status"] = str(body["status"])
                response.content = json.dumps(body)
        return response
