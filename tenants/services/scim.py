"""Provisioning by a tenant's identity provider (SCIM 2.0): a SCIM User is a person's
membership in the tenant, a SCIM Group a set of members whose name may carry a role.

Everything goes through the tenancy services: a deactivated user (`active: false`) is
`member_deactivate` (their keys settled by the tenant's departed_member_keys policy, every
session of theirs ended on its next request), a deleted one `member_remove` (and signed out),
a role a group gives `member_update`. A tenant's SCIM client changes a person's own fields
(name, email, username) only when that person belongs to that tenant alone and is no operator:
another tenant's member is never edited from here."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction

from tenants.errors import InvalidRequest
from tenants.models import ROLE_RANK, Membership, Role, ScimGroup, Tenant
from tenants.services import tenancy
from tenants.services.audit import audit_change, audit_record, snapshot
from tenants.services.sessions import user_sessions_end
from tenants.services.validation import Conflict, save_validated

DEFAULT_ROLE = Role.VIEWER  # until a group gives more: the least power by default


@dataclass(slots=True)
class ScimUserFields:
    """What a SCIM request says of a user; None: not said (left as it is)."""

    user_name: str | None = None
    email: str | None = None
    given_name: str | None = None
    family_name: str | None = None
    external_id: str | None = None
    active: bool | None = None


def _managed_here(user: User, tenant: Tenant) -> bool:
    return (
        not (user.is_staff or user.is_superuser)
        and not Membership.objects.filter(user=user).exclude(tenant=tenant).exists()
    )


def _user_fields_set(user: User, fields: ScimUserFields) -> None:
    if fields.user_name is not None and fields.user_name != user.username:
        if get_user_model().objects.filter(username=fields.user_name).exclude(pk=user.pk).exists():
            raise Conflict("userName is taken.", param="userName")
        user.username = fields.user_name
    if fields.email is not None:
        try:
            EmailValidator()(fields.email)
        except ValidationError:
            raise InvalidRequest("emails: not a valid address.", param="emails") from None
        user.email = fields.email
    if fields.given_name is not None:
        user.first_name = fields.given_name[:150]
    if fields.family_name is not None:
        user.last_name = fields.family_name[:150]


def _user_fields_apply(user: User, fields: ScimUserFields, tenant: Tenant) -> None:
    before = snapshot(user)
    _user_fields_set(user, fields)
    save_validated(user, unique_param="userName")
    audit_change("user.update", user, before=before, tenant=tenant)


def scim_user_create(*, tenant: Tenant, fields: ScimUserFields) -> Membership:
    """Provision a member (role viewer until a group gives more). An existing account with
    that userName is linked, its own fields left alone unless it is this tenant's alone."""
    if not fields.user_name:
        raise InvalidRequest("userName is required.", param="userName")
    with transaction.atomic():
        user = get_user_model().objects.filter(username=fields.user_name).first()
        if user is None:
            user = get_user_model()(username=fields.user_name)
            user.set_unusable_password()  # people provisioned here sign in through SSO
            _user_fields_set(user, fields)
            save_validated(user, unique_param="userName")
            audit_change("user.create", user, tenant=tenant)
        elif Membership.objects.filter(tenant=tenant, user=user).exists():
            raise Conflict("A user with this userName is already provisioned.", param="userName")
        elif _managed_here(user, tenant):
            _user_fields_apply(user, fields, tenant)
        membership = tenancy.member_add(
            tenant=tenant,
            user=user,
            role=DEFAULT_ROLE,
            actor_role=Role.OWNER,
            source=Membership.Source.SCIM,
            scim_external_id=fields.external_id or "",
        )
        if fields.active is False:
            tenancy.member_deactivate(membership=membership, reason="deprovisioned (SCIM)")
    return membership


def scim_user_update(*, membership: Membership, fields: ScimUserFields) -> Membership:
    with transaction.atomic():
        if _managed_here(membership.user, membership.tenant):
            _user_fields_apply(membership.user, fields, membership.tenant)
        if fields.external_id is not None and fields.external_id != membership.scim_external_id:
            before = snapshot(membership)
            membership.scim_external_id = fields.external_id[:200]
            membership.save(update_fields=["scim_external_id"])
            audit_change("member.update", membership, before=before)
        if fields.active is False:
            tenancy.member_deactivate(membership=membership, reason="deprovisioned (SCIM)")
        elif fields.active is True:
            tenancy.member_reactivate(membership=membership)
    return membership


def scim_user_delete(*, membership: Membership) -> None:
    """Remove the member (keys by policy) and sign them out at once."""
    with transaction.atomic():
        tenancy.member_remove(membership=membership, actor_role=Role.OWNER)
        user_sessions_end(user=membership.user)


def _role_from_groups(membership: Membership) -> str:
    roles = [g.role for g in membership.scim_groups.all() if g.role]
    return max(roles, key=ROLE_RANK.__getitem__) if roles else DEFAULT_ROLE


def _roles_sync(memberships) -> None:
    """Each member's role becomes the highest their groups give (owners are left alone)."""
    for membership in memberships:
        if membership.role == Role.OWNER:
            continue
        role = _role_from_groups(membership)
        if role != membership.role:
            tenancy.member_update(membership=membership, role=role, actor_role=Role.OWNER)


def scim_group_save(
    *,
    group: ScimGroup,
    display_name: str | None,
    external_id: str | None,
    members: list[Membership] | None,
) -> ScimGroup:
    """Create or change a group: its name, and (when given) its whole member list."""
    with transaction.atomic():
        before = snapshot(group) if group.pk else None
        if display_name is not None:
            group.display_name = display_name.strip()[:200]
        if not group.display_name:
            raise InvalidRequest("displayName is required.", param="displayName")
        if external_id is not None:
            group.scim_external_id = external_id[:200]
        group = save_validated(group, unique_param="displayName")
        audit_change("scim_group.update" if before else "scim_group.create", group, before=before)
        old = set(group.members.all())
        if members is not None:
            scim_group_members_set(group=group, members=members)
        _roles_sync(old | set(members or []))
    return group


def scim_group_members_set(*, group: ScimGroup, members: list[Membership]) -> None:
    if any(m.tenant_id != group.tenant_id for m in members):
        raise InvalidRequest("members: not a user of this tenant.", param="members")
    before = sorted(str(m.scim_id) for m in group.members.all())
    group.members.set(members)
    after = sorted(str(m.scim_id) for m in members)
    if before != after:
        audit_record(
            action="scim_group.members",
            object_type="scimgroup",
            object_id=group.pk,
            object_repr=group.display_name,
            tenant=group.tenant,
            before={"members": before},
            after={"members": after},
        )


def scim_group_members_change(
    *, group: ScimGroup, add: list[Membership], remove: list[Membership]
) -> None:
    with transaction.atomic():
        current = set(group.members.all())
        scim_group_members_set(group=group, members=list((current | set(add)) - set(remove)))
        _roles_sync(current | set(add))


def scim_group_delete(*, group: ScimGroup) -> None:
    with transaction.atomic():
        members = list(group.members.all())
        audit_change("scim_group.delete", group, before=snapshot(group), deleted=True)
        group.delete()
        _roles_sync(members)
