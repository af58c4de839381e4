"""The portal's side of a departing member's keys (issue 28, finding 2): the page says which
keys die before removal, only owners choose the policy, and an admin sees no buttons on an
owner's row."""

from tenants.models import ApiKey, Membership, Role, Tenant
from tenants.services.tenancy import tenant_update
from tests.tenants.test_member_keys import usable


def membership_of(user, tenant) -> Membership:
    return Membership.objects.get(user=user, tenant=tenant)


def test_the_portal_says_which_keys_die_before_removal(tenant, mia, mias_keys, portal_client):
    client, _ = portal_client(Role.ADMIN)
    url = f"/portal/t/acme/members/{membership_of(mia, tenant).pk}/remove/"
    page = client.get(url).content.decode()
    assert "These keys will stop working at once" in page
    for key in ApiKey.objects.filter(created_by=mia):
        assert key.prefix in page
    assert all(usable(plain) for plain in mias_keys.values())  # looking changes nothing
    assert client.post(url).status_code == 302
    assert not any(usable(plain) for plain in mias_keys.values())


def test_only_owners_see_and_set_the_policy_in_the_portal(tenant, portal_client):
    admin, _ = portal_client(Role.ADMIN)
    assert (
        'name="departed_member_keys"' not in admin.get("/portal/t/acme/members/").content.decode()
    )
    assert (
        admin.post(
            "/portal/t/acme/members/keys-policy/", {"departed_member_keys": "hand_over"}
        ).status_code
        == 403
    )
    owner, _ = portal_client(Role.OWNER)
    assert (
        owner.post(
            "/portal/t/acme/members/keys-policy/", {"departed_member_keys": "hand_over"}
        ).status_code
        == 302
    )
    assert Tenant.objects.get(pk=tenant.pk).departed_member_keys == "hand_over"
    bad = owner.post("/portal/t/acme/members/keys-policy/", {"departed_member_keys": "keep"})
    assert bad.status_code == 400
    tenant_update(tenant=tenant, departed_member_keys="revoke")


def test_an_admin_sees_no_change_or_remove_on_an_owners_row(tenant, portal_client, mia):
    client, _ = portal_client(Role.ADMIN)
    page = client.get("/portal/t/acme/members/").content.decode()
    assert 'aria-label="Remove olivia"' not in page and 'aria-label="Remove mia"' in page
    assert "Change role of olivia" not in page and "Change role of mia" in page
