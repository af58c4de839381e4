"""Who is calling the management API: a signed-in person (session) or a program (API key),
and what role that gives them in a tenant."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication

from tenants.errors import NotFound, PermissionDenied
from tenants.models import ROLE_RANK, ApiKey, Role, Scope, Tenant
from tenants.selectors import membership_get, tenant_get
from tenants.services.keys import api_key_authenticate
from tenants.services.sessions import SSO_REQUIRED, tenant_needs_sso


class ApiKeyPrincipal:
    """request.user for a key-authenticated request: acts in the key's tenant only."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = id = None

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key

    def __str__(self) -> str:
        return f"key {self.api_key.prefix}"


def bearer_token(request) -> str | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class ApiKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer fl-...`. No CSRF check: a header cannot be forged cross-site."""

    def authenticate(self, request):
        token = bearer_token(request)
        if token is None:
            return None
        key = api_key_authenticate(plain=token)
        return ApiKeyPrincipal(key), key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="fairlane"'


def principal_role(*, principal, tenant: Tenant) -> str | None:
    """The principal's role in the tenant, or None when it is not one of theirs."""
    if isinstance(principal, ApiKeyPrincipal):
        key = principal.api_key
        if key.tenant_id != tenant.id:
            return None
        if Scope.MANAGEMENT_WRITE in key.scopes:
            return Role.ADMIN
        if Scope.MANAGEMENT_READ in key.scopes:
            return Role.VIEWER
        raise PermissionDenied("This API key lacks the management.read scope.")
    membership = membership_get(tenant=tenant, user=principal)
    if membership is not None and tenant_needs_sso(tenant=tenant, user=principal):
        raise PermissionDenied(SSO_REQUIRED)
    return membership.role if membership else None


def tenant_for(*, principal, slug: str, min_role: str = Role.VIEWER) -> tuple[Tenant, str]:
    """The tenant named by the URL and the principal's role in it. A tenant the principal does
    not belong to is a 404, exactly like one that does not exist."""
    tenant = tenant_get(slug=slug)
    role = principal_role(principal=principal, tenant=tenant) if tenant else None
    if tenant is None or role is None:
        raise NotFound("No such tenant.")
    if ROLE_RANK[role] < ROLE_RANK[min_role]:
        raise PermissionDenied(f"This needs the {min_role} role or higher in {slug}.")
    return tenant, role


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes key auth: `Authorization: Bearer fl-...`."""

    target_class = "tenants.apis.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "fl-<key id>-<secret>"}
