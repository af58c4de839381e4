"""Who is acting, and from where: set once per request (tenants.middleware) or per management
command, read by every audit record written meanwhile. A context variable, so threads and
asyncio hops of the same request inherit it."""

from __future__ import annotations

import getpass
import re
import secrets
import socket
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

from tenants.models import AuditRecord

Actor = AuditRecord.ActorType


@dataclass(frozen=True, slots=True)
class AuditContext:
    source: str  # portal, api, admin, ops, scim, sso, command, system
    request: object | None = None  # the HttpRequest: its user is read when a record is written
    actor_type: str = ""  # set for commands and SCIM; else from request.user
    actor_id: str = ""
    actor: str = ""
    request_id: str = ""
    trace_id: str = ""
    ip: str = ""


SYSTEM = AuditContext(source="system", actor_type=Actor.SYSTEM, actor="system")
_current: ContextVar[AuditContext] = ContextVar("fairlane_audit_context", default=SYSTEM)
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def audit_context_current() -> AuditContext:
    return _current.get()


@contextmanager
def audit_context(context: AuditContext):
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def request_context(request, *, source: str) -> AuditContext:
    """A web request's context: its id (X-Request-Id when it is sane, else a new one), the
    trace of its `traceparent` (else a new one) and the connection's address (uvicorn sets
    it from X-Forwarded-For only for FORWARDED_ALLOW_IPS)."""
    given = request.headers.get("x-request-id", "")
    request_id = given if _REQUEST_ID.match(given) else "req_" + secrets.token_hex(12)
    match = _TRACEPARENT.match(request.headers.get("traceparent", "").strip().lower())
    trace_id = match.group(1) if match and set(match.group(1)) != {"0"} else secrets.token_hex(16)
    return AuditContext(
        source=source,
        request=request,
        request_id=request_id,
        trace_id=trace_id,
        ip=request.META.get("REMOTE_ADDR", "")[:45],
    )


def command_context(name: str) -> AuditContext:
    """A management command's context: the command, the operating-system user who ran it and
    the host (a command has no request; its trace id ties its records together)."""
    try:
        who = getpass.getuser()
    except (KeyError, OSError):
        who = "unknown"
    return AuditContext(
        source="command",
        actor_type=Actor.COMMAND,
        actor_id=name[:80],
        actor=f"manage.py {name} (by {who} on {socket.gethostname()})"[:200],
        request_id="cmd_" + secrets.token_hex(12),
        trace_id=secrets.token_hex(16),
    )


def actor_of(context: AuditContext) -> tuple[str, str, str]:
    """(actor type, id, name) of whoever acts in `context`: fixed for commands and SCIM, else
    the request's principal (a person, or an API key through the management API)."""
    if context.actor_type:
        return context.actor_type, context.actor_id, context.actor
    user = getattr(context.request, "user", None)
    api_key = getattr(user, "api_key", None)
    if api_key is not None:
        return Actor.API_KEY, str(api_key.pk), api_key.prefix
    scim_token = getattr(user, "scim_token", None)
    if scim_token is not None:
        return Actor.SCIM, str(scim_token.pk), scim_token.prefix
    if user is not None and getattr(user, "is_authenticated", False):
        return Actor.USER, str(user.pk), user.get_username()
    return Actor.SYSTEM, "", "anonymous" if context.request is not None else "system"


def with_actor(
    context: AuditContext, *, actor_type: str, actor_id: str, actor: str
) -> AuditContext:
    return replace(context, actor_type=actor_type, actor_id=actor_id[:80], actor=actor[:200])
