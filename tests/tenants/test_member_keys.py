"""The keys a member made follow them out (issue 28, finding 2: a removed member's
management.read, inference and playground keys all kept working): removal, a deactivated or
deleted account, and a role that could not have made the key revoke them, or hand inference
keys over to their agent where an owner chose that; the portal says which before removal."""

from django.test import Client

from tenants.errors import AuthenticationFailed
from tenants.models import ApiKey, Membership, Role
from tenants.services.keys import api_key_authenticate, api_key_create
from tenants.services.tenancy import member_add, member_remove, member_update


def usable(plain: str) -> bool:
    try:
        api_key_authenticate(plain=plain)
    except AuthenticationFailed:
        return False
    return True


def membership_of(user, tenant) -> Membership:
    return Membership.objects.get(user=user, tenant=tenant)


def test_removing_a_member_revokes_every_key_they_made(tenant, mia, mias_keys, owner, client_for):
    admin = client_for(user=owner)
    member_id = membership_of(mia, tenant).pk
    shown = admin.get(f"/api/tenants/acme/members/{member_id}/").json()
    assert sorted(shown["keys_on_removal"]["revoked"]) == sorted(
        k.prefix for k in ApiKey.objects.filter(created_by=mia)
    )
    assert shown["keys_on_removal"]["handed_over"] == []
    assert admin.delete(f"/api/tenants/acme/members/{member_id}/").status_code == 204
    assert not any(usable(plain) for plain in mias_keys.values())
    reader = client_for(key=mias_keys["read"])
    assert reader.get("/api/tenants/acme/members/").status_code == 401  # members' emails
    chat = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {mias_keys['infer']}")
    assert chat.status_code == 401


def test_an_owner_may_hand_inference_keys_over_to_their_agent(
    tenant, mia, mias_keys, owner, member_of, client_for
):
    admin = client_for(user=member_of(tenant, Role.ADMIN, "ada"))
    refused = admin.patch(
        "/api/tenants/acme/", {"departed_member_keys": "hand_over"}, format="json"
    )
    assert refused.status_code == 403  # the choice is the owner's
    response = client_for(user=owner).patch(
        "/api/tenants/acme/", {"departed_member_keys": "hand_over"}, format="json"
    )
    assert response.json()["departed_member_keys"] == "hand_over"
    fates = member_remove(membership=membership_of(mia, tenant), actor_role=Role.OWNER)
    assert sorted(k.name for k in fates.handed_over) == ["infer", "playground (mia)"]
    assert [k.name for k in fates.revoked] == ["read"]
    assert usable(mias_keys["infer"]) and usable(mias_keys["playground"])
    assert not usable(mias_keys["read"])
    assert ApiKey.objects.get(name="infer").handed_over_at is not None


def test_a_role_that_could_not_make_a_key_loses_it(tenant, agent, make_user):
    ada = make_user("ada")
    member_add(tenant=tenant, user=ada, role=Role.ADMIN, actor_role=Role.OWNER)
    _, write = api_key_create(
        tenant=tenant,
        agent=agent,
        scopes=["management.write"],
        created_by=ada,
        actor_role=Role.ADMIN,
    )
    _, infer = api_key_create(
        tenant=tenant, agent=agent, scopes=["inference"], created_by=ada, actor_role=Role.ADMIN
    )
    member_update(membership=membership_of(ada, tenant), role=Role.MEMBER, actor_role=Role.OWNER)
    assert not usable(write) and usable(infer)
    member_update(membership=membership_of(ada, tenant), role=Role.VIEWER, actor_role=Role.OWNER)
    assert not usable(infer)  # a viewer cannot make keys at all


def test_a_deactivated_or_deleted_account_loses_its_keys_in_every_tenant(
    tenant, other_tenant, agent, other_agent, mia, make_user
):
    member_add(tenant=other_tenant, user=mia, role=Role.MEMBER, actor_role=Role.OWNER)
    _, here = api_key_create(tenant=tenant, agent=agent, created_by=mia, actor_role=Role.MEMBER)
    _, there = api_key_create(
        tenant=other_tenant, agent=other_agent, created_by=mia, actor_role=Role.MEMBER
    )
    mia.is_active = False
    mia.save()  # as the admin's form or SCIM does
    assert not usable(here) and not usable(there)
    leo = make_user("leo")
    member_add(tenant=tenant, user=leo, role=Role.MEMBER, actor_role=Role.OWNER)
    _, leos = api_key_create(tenant=tenant, agent=agent, created_by=leo, actor_role=Role.MEMBER)
    leo.delete()  # created_by would be cleared, leaving the key nobody's
    assert not usable(leos)


def test_a_key_minted_by_a_key_follows_the_person_behind_it(tenant, agent, mia, client_for, owner):
    _, owners = api_key_create(
        tenant=tenant, agent=agent, scopes=["management.write"], created_by=owner
    )
    member_update(membership=membership_of(mia, tenant), role=Role.ADMIN, actor_role=Role.OWNER)
    _, mias_writer = api_key_create(
        tenant=tenant,
        agent=agent,
        scopes=["management.write"],
        created_by=mia,
        actor_role=Role.ADMIN,
    )
    child = client_for(key=mias_writer).post(
        "/api/tenants/acme/keys/",
        {"agent": str(agent.pk), "name": "child", "scopes": ["inference"]},
        format="json",
    )
    assert child.status_code == 201
    assert ApiKey.objects.get(name="child").created_by == mia
    member_remove(membership=membership_of(mia, tenant), actor_role=Role.OWNER)
    assert not usable(child.json()["key"]) and not usable(mias_writer)
    assert usable(owners)  # the owner's own key is untouched


def test_removing_a_member_leaves_their_keys_in_another_tenant(
    tenant, other_tenant, agent, other_agent, mia
):
    member_add(tenant=other_tenant, user=mia, role=Role.MEMBER, actor_role=Role.OWNER)
    _, there = api_key_create(
        tenant=other_tenant, agent=other_agent, created_by=mia, actor_role=Role.MEMBER
    )
    member_remove(membership=membership_of(mia, tenant), actor_role=Role.OWNER)
    assert usable(there)
