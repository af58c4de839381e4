"""Members: add by username or email, change role, remove; the API's owner rules hold (only
owners make or unmake owners; a tenant keeps one)."""

from django.shortcuts import redirect

from tenants import selectors
from tenants.errors import InvalidRequest
from tenants.models import Role, Tenant
from tenants.portal.access import portal_page
from tenants.portal.forms import MemberAddForm, MemberRoleForm, form_error_apply
from tenants.portal.pages import render_page
from tenants.services import portal as portal_services
from tenants.services import tenancy
from tenants.services.member_keys import member_keys_fate


def _page(request, portal, add_form, status=200, error=""):
    members = list(selectors.membership_list(tenant=portal.tenant))
    for membership in members:  # only owners change or remove an owner: others see no button
        membership.manageable = portal.can_admin and (
            membership.role != Role.OWNER or portal.role == Role.OWNER
        )
    return render_page(
        request,
        portal,
        "portal/members/list.html",
        {
            "members": members,
            "key_policies": Tenant.DepartedMemberKeys.choices,
            "add_form": add_form,
            "roles": Role.choices,
            "error": error,
        },
        section="members",
        status=status,
    )


@portal_page()
def member_list(request, portal):
    return _page(request, portal, MemberAddForm())


@portal_page(Role.ADMIN, write=True)
def member_add(request, portal):
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            portal_services.member_add_by_identifier(
                tenant=portal.tenant,
                identifier=form.cleaned_data["username"],
                role=form.cleaned_data["role"],
                actor_role=portal.role,
            )
            return redirect("portal:members", slug=portal.tenant.slug)
        except InvalidRequest as exc:
            form_error_apply(form, exc, {"user": "username"})
    return _page(request, portal, form, status=400)


@portal_page(Role.ADMIN, write=True)
def member_role(request, portal, member_id: int):
    membership = selectors.membership_get_by_id(tenant=portal.tenant, membership_id=member_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        return _page(request, portal, MemberAddForm(), status=400, error="Pick a valid role.")
    try:
        tenancy.member_update(
            membership=membership, role=form.cleaned_data["role"], actor_role=portal.role
        )
    except InvalidRequest as exc:
        return _page(request, portal, MemberAddForm(), status=400, error=exc.message)
    return redirect("portal:members", slug=portal.tenant.slug)


@portal_page(Role.ADMIN, form=True)
def member_remove(request, portal, member_id: int):
    """GET: what removing the member would do to the keys they made; POST: remove them."""
    membership = selectors.membership_get_by_id(tenant=portal.tenant, membership_id=member_id)
    if request.method != "POST":
        fates = member_keys_fate(tenant=portal.tenant, user=membership.user, role=None)
        return render_page(
            request,
            portal,
            "portal/members/remove.html",
            {
                "member": membership,
                "fates": fates,
                "hand_over": portal.tenant.departed_member_keys
                == Tenant.DepartedMemberKeys.HAND_OVER,
            },
            section="members",
        )
    try:
        tenancy.member_remove(membership=membership, actor_role=portal.role)
    except InvalidRequest as exc:
        return _page(request, portal, MemberAddForm(), status=400, error=exc.message)
    if membership.user_id == request.user.pk:
        return redirect("portal:home")
    return redirect("portal:members", slug=portal.tenant.slug)


@portal_page(Role.OWNER, write=True)
def member_keys_policy(request, portal):
    """The owner's explicit choice of what becomes of a departing member's inference keys."""
    try:
        tenancy.tenant_update(
            tenant=portal.tenant,
            actor_role=portal.role,
            departed_member_keys=request.POST.get("departed_member_keys"),
        )
    except InvalidRequest as exc:
        return _page(request, portal, MemberAddForm(), status=400, error=exc.message)
    return redirect("portal:members", slug=portal.tenant.slug)
