"""Per request, for the site (the portal, the management API, the admin, the ops dashboard,
SCIM and sign-in; never /v1): the audit context every record written meanwhile reads (who,
request id, trace id, address), and the end of a session its user was signed out of
(`user_sessions_end`: a SCIM deprovisioning, a deactivated account) before anything runs.
Async-capable, like every middleware on the /v1 path, which it passes straight through."""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from tenants.services.audit import audit_context, request_context
from tenants.services.sessions import session_check

# Path prefix -> the audit record's `source`.
SOURCES = (
    ("/portal/", "portal"),
    ("/api/", "api"),
    ("/admin/", "admin"),
    ("/ops/", "ops"),
    ("/scim/", "scim"),
    ("/oidc/", "sso"),
)


def source_of(path: str) -> str | None:
    for prefix, source in SOURCES:
        if path.startswith(prefix):
            return source
    return None


class GovernanceMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        source = source_of(request.path_info)
        if source is None:
            return self.get_response(request)
        session_check(request)
        with audit_context(request_context(request, source=source)):
            return self.get_response(request)

    async def _acall(self, request):
        source = source_of(request.path_info)
        if source is None:
            return await self.get_response(request)
        await sync_to_async(session_check)(request)
        with audit_context(request_context(request, source=source)):
            return await self.get_response(request)
