"""API keys: the list (prefix, scopes, agent, last use, expiry), creation and rotation, whose
response is the only page that ever holds the new key (no-store, never in a redirect, a
message or a log), and revocation."""

from datetime import timedelta

from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.cache import never_cache

from tenants import selectors
from tenants.errors import InvalidRequest
from tenants.models import Role
from tenants.portal.access import portal_page
from tenants.portal.forms import KeyForm, RotateForm, form_error_apply
from tenants.portal.pages import render_page
from tenants.services import keys


def _key_form(portal, data=None) -> KeyForm:
    agents = selectors.agent_list(tenant=portal.tenant).filter(is_active=True)
    return KeyForm(data, agents=agents)


def _list(request, portal, form, status=200, error=""):
    now = timezone.now()
    all_keys = selectors.api_key_list(tenant=portal.tenant)
    rotated = set(all_keys.exclude(rotated_from=None).values_list("rotated_from_id", flat=True))
    rows = [
        {"key": key, "state": _state(key, now, rotated)}
        for key in all_keys.select_related("created_by")
    ]
    return render_page(
        request,
        portal,
        "portal/keys/list.html",
        {"rows": rows, "form": form, "rotate_form": RotateForm(), "error": error},
        section="keys",
        status=status,
    )


def _state(key, now, rotated: set) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    return "in grace" if key.pk in rotated else "active"


@portal_page()
def key_list(request, portal):
    return _list(request, portal, _key_form(portal))


def _created(request, portal, key, plain, *, rotated_from=None):
    response = render_page(
        request,
        portal,
        "portal/keys/created.html",
        {"key": key, "plain": plain, "rotated_from": rotated_from},
        section="keys",
        status=201,
    )
    response["Cache-Control"] = "no-store"
    return response


@never_cache
@portal_page(Role.MEMBER, write=True)
def key_create(request, portal):
    form = _key_form(portal, request.POST)
    if form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        try:
            key, plain = keys.api_key_create(
                tenant=portal.tenant,
                agent=form.cleaned_data["agent"],
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                expires_at=timezone.now() + timedelta(days=days) if days else None,
                created_by=request.user,
                actor_role=portal.role,
            )
            return _created(request, portal, key, plain)
        except InvalidRequest as exc:
            form_error_apply(form, exc)
    return _list(request, portal, form, status=400)


@never_cache
@portal_page(Role.MEMBER, write=True)
def key_rotate(request, portal, key_id):
    old = selectors.api_key_get(tenant=portal.tenant, key_id=key_id)
    form = RotateForm(request.POST)
    if not form.is_valid():
        return redirect("portal:keys", slug=portal.tenant.slug)
    try:
        key, plain = keys.api_key_rotate(
            key=old,
            grace_seconds=form.cleaned_data["grace_seconds"],
            created_by=request.user,
            actor_role=portal.role,
        )
    except InvalidRequest as exc:
        return _list(request, portal, _key_form(portal), status=400, error=exc.message)
    old.refresh_from_db()
    return _created(request, portal, key, plain, rotated_from=old)


@portal_page(Role.MEMBER, write=True)
def key_revoke(request, portal, key_id):
    keys.api_key_revoke(key=selectors.api_key_get(tenant=portal.tenant, key_id=key_id))
    return redirect("portal:keys", slug=portal.tenant.slug)
