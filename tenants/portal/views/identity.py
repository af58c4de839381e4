"""Sign-in settings (admins): SCIM tokens for the tenant's identity provider (shown once,
revocable), the single sign-on providers that map people into this tenant, and (owners)
whether passwords are turned off for it ("SSO only")."""

from django.shortcuts import redirect
from django.views.decorators.cache import never_cache

from tenants.errors import InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.pages import render_page
from tenants.services import tenancy
from tenants.services.scim_tokens import scim_token_create as token_create
from tenants.services.scim_tokens import scim_token_list
from tenants.services.scim_tokens import scim_token_revoke as token_revoke
from tenants.services.sso.providers import providers


def _page(request, portal, *, status=200, error="", created=None, plain=""):
    mapped = [(p, [r for r in p.rules if r[2] == portal.tenant.slug]) for p in providers().values()]
    return render_page(
        request,
        portal,
        "portal/identity/index.html",
        {
            "tokens": scim_token_list(tenant=portal.tenant),
            "error": error,
            "providers": [(p, rules) for p, rules in mapped if rules],
            "scim_base": request.build_absolute_uri("/scim/v2/"),
            "created": created,
            "plain": plain,
        },
        section="identity",
        status=status,
    )


@portal_page(Role.ADMIN)
def identity(request, portal):
    return _page(request, portal)


@never_cache
@portal_page(Role.ADMIN, write=True)
def scim_token_create(request, portal):
    token, plain = token_create(
        tenant=portal.tenant, name=request.POST.get("name", ""), created_by=request.user
    )
    response = _page(request, portal, status=201, created=token, plain=plain)
    response["Cache-Control"] = "no-store"
    return response


@portal_page(Role.ADMIN, write=True)
def scim_token_revoke(request, portal, token_id):
    token_revoke(tenant=portal.tenant, token_id=token_id)
    return redirect("portal:identity", slug=portal.tenant.slug)


@portal_page(Role.OWNER, write=True)
def sso_only_set(request, portal):
    try:
        tenancy.tenant_update(
            tenant=portal.tenant,
            actor_role=portal.role,
            sso_only=request.POST.get("sso_only") == "on",
        )
    except InvalidRequest as exc:
        return _page(request, portal, status=400, error=exc.message)
    return redirect("portal:identity", slug=portal.tenant.slug)
