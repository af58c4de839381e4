"""Playground: chat with a model the agent may use, streamed over the /ws/v1/chat websocket
with a short-lived key the page asks for and keeps in memory only; and the agent's routing
page, which reads and writes through the management API like any other client."""

from django.core.exceptions import ValidationError
from django.http import JsonResponse
from django.views.decorators.cache import never_cache

from tenants import selectors
from tenants.errors import InvalidRequest, NotFound
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.pages import render_page
from tenants.services.portal import playground_key_issue


@portal_page()
def playground(request, portal):
    agents = selectors.agent_list(tenant=portal.tenant).filter(is_active=True)
    return render_page(
        request,
        portal,
        "portal/playground/index.html",
        {"agents": agents, "can_play": portal.can(Role.MEMBER)},
        section="playground",
    )


@never_cache
@portal_page(Role.MEMBER, write=True)
def playground_key(request, portal):
    """A fresh key for the page (JSON, not cached, never rendered into a page)."""
    try:
        agent = selectors.agent_get(tenant=portal.tenant, agent_id=request.POST.get("agent"))
    except (NotFound, ValidationError):  # a malformed id is as unknown as a missing one
        return JsonResponse(
            {"error": {"message": "No such agent.", "code": "not_found"}}, status=404
        )
    try:
        key, plain = playground_key_issue(
            tenant=portal.tenant, agent=agent, user=request.user, actor_role=portal.role
        )
    except InvalidRequest as exc:
        return JsonResponse({"error": {"message": exc.message, "code": exc.code}}, status=400)
    response = JsonResponse(
        {"key": plain, "prefix": key.prefix, "expires_at": key.expires_at.isoformat()}, status=201
    )
    response["Cache-Control"] = "no-store"
    return response


@portal_page()
def agent_routing(request, portal, agent_id):
    agent = selectors.agent_get(tenant=portal.tenant, agent_id=agent_id)
    return render_page(
        request, portal, "portal/routing/agent.html", {"agent": agent}, section="agents"
    )
