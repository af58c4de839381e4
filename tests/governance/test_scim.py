"""SCIM 2.0 as an identity provider drives it: create, read, filter, update (PUT and the
PATCH shapes Okta and Entra ID send), deactivate and delete users, groups and their members;
every response in the RFC 7643/7644 shape (JSON Schema); deprovisioning ends the person's
session at once and settles their keys by the tenant's policy; a token sees its tenant only."""

import json

import pytest
from django.test import Client
from jsonschema import Draft202012Validator, FormatChecker

from tenants.models import ApiKey, Membership, Role, Tenant
from tenants.services.keys import api_key_create
from tenants.services.scim_tokens import scim_token_create, scim_token_revoke
from tenants.services.tenancy import tenant_update
from tests.governance.conftest import last_record
from tests.governance.scim_schemas import ERROR, LIST_RESPONSE, resource_schema

pytestmark = pytest.mark.django_db
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def valid(document: dict, schema: dict) -> dict:
    errors = list(
        Draft202012Validator(schema, format_checker=FormatChecker()).iter_errors(document)
    )
    assert not errors, [e.message for e in errors]
    return document


class Scim:
    def __init__(self, token: str):
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def __call__(self, method: str, path: str, body=None, status: int = 200):
        response = getattr(self.client, method)(
            f"/scim/v2/{path}",
            data=json.dumps(body) if body is not None else None,
            content_type="application/scim+json",
        )
        assert response.status_code == status, response.content
        if response.content:
            assert response["Content-Type"].startswith("application/scim+json")
        return response.json() if response.content else None


@pytest.fixture
def scim(tenant):
    return Scim(scim_token_create(tenant=tenant, name="okta")[1])


def new_user(scim, name="ada@acme.example", **extra):
    body = {
        "schemas": [USER_SCHEMA],
        "userName": name,
        "externalId": f"okta-{name}",
        "name": {"givenName": "Ada", "familyName": "Lovelace"},
        "emails": [{"value": name, "primary": True, "type": "work"}],
        "active": True,
        **extra,
    }
    return valid(scim("post", "Users", body, status=201), resource_schema("User"))


def test_create_read_filter_and_list_users_in_the_official_shape(scim, tenant):
    user = new_user(scim)
    membership = Membership.objects.get(scim_id=user["id"])
    assert (membership.tenant, membership.role, membership.source) == (tenant, "viewer", "scim")
    assert not membership.user.has_usable_password()  # they sign in through SSO
    assert (
        valid(scim("get", f"Users/{user['id']}"), resource_schema("User"))["userName"]
        == "ada@acme.example"
    )
    found = valid(scim("get", 'Users?filter=userName eq "ada@acme.example"'), LIST_RESPONSE)
    assert found["totalResults"] == 1 and found["Resources"][0]["id"] == user["id"]
    everyone = valid(scim("get", "Users"), LIST_RESPONSE)
    assert {r["userName"] for r in everyone["Resources"]} == {"ada@acme.example", "olivia"}
    assert last_record(action="member.add").actor_type == "scim"
    duplicate = scim(
        "post", "Users", {"schemas": [USER_SCHEMA], "userName": "ada@acme.example"}, status=409
    )
    assert valid(duplicate, ERROR)["scimType"] == "uniqueness"


def test_put_and_the_patch_shapes_okta_and_entra_send(scim):
    user = new_user(scim)
    scim(
        "put",
        f"Users/{user['id']}",
        {
            "schemas": [USER_SCHEMA],
            "userName": user["userName"],
            "name": {"givenName": "Augusta", "familyName": "King"},
            "emails": [{"value": "augusta@acme.example"}],
        },
    )
    okta = {
        "schemas": [PATCH],
        "Operations": [{"op": "replace", "value": {"name": {"familyName": "Byron"}}}],
    }
    entra = {
        "schemas": [PATCH],
        "Operations": [
            {"op": "Replace", "path": 'emails[type eq "work"].value', "value": "ada@byron.example"},
            {"op": "Add", "path": "externalId", "value": "entra-1"},
        ],
    }
    scim("patch", f"Users/{user['id']}", okta)
    after = valid(scim("patch", f"Users/{user['id']}", entra), resource_schema("User"))
    assert after["name"]["givenName"] == "Augusta" and after["name"]["familyName"] == "Byron"
    assert after["emails"][0]["value"] == "ada@byron.example" and after["externalId"] == "entra-1"
    bad = scim(
        "patch",
        f"Users/{user['id']}",
        {"schemas": [PATCH], "Operations": [{"op": "replace", "path": "active", "value": "maybe"}]},
        status=400,
    )
    valid(bad, ERROR)


def test_deactivation_ends_the_session_and_settles_keys_by_policy(scim, tenant, agent):
    tenant_update(tenant=tenant, departed_member_keys=Tenant.DepartedMemberKeys.HAND_OVER)
    user = new_user(scim)
    membership = Membership.objects.get(scim_id=user["id"])
    from tenants.services.tenancy import member_update

    member_update(membership=membership, role=Role.MEMBER, actor_role=Role.OWNER)
    inference, _ = api_key_create(tenant=tenant, agent=agent, created_by=membership.user)
    management, _ = api_key_create(
        tenant=tenant, agent=agent, created_by=membership.user, scopes=["management.read"]
    )
    browser = Client()
    browser.force_login(membership.user)
    assert browser.get(f"/portal/t/{tenant.slug}/").status_code == 200
    # Entra ID's shape: a string for the boolean.
    scim(
        "patch",
        f"Users/{user['id']}",
        {"schemas": [PATCH], "Operations": [{"op": "Replace", "path": "active", "value": "False"}]},
    )
    membership.refresh_from_db()
    assert not membership.is_active
    response = browser.get(f"/portal/t/{tenant.slug}/")
    assert response.status_code == 302 and "/portal/login/" in response["Location"]
    assert ApiKey.objects.get(pk=inference.pk).handed_over_at is not None
    assert ApiKey.objects.get(pk=management.pk).revoked_at is not None
    assert last_record(action="member.deactivate").source == "scim"
    assert scim("get", f"Users/{user['id']}")["active"] is False
    scim(
        "patch",
        f"Users/{user['id']}",
        {"schemas": [PATCH], "Operations": [{"op": "replace", "value": {"active": True}}]},
    )
    membership.refresh_from_db()
    assert membership.is_active
    scim("delete", f"Users/{user['id']}", status=204)
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert last_record(action="member.remove").actor_type == "scim"


def test_groups_give_their_role_and_membership_changes_follow(scim, tenant):
    ada, bob = new_user(scim), new_user(scim, "bob@acme.example")
    group = valid(
        scim(
            "post",
            "Groups",
            {
                "schemas": [GROUP_SCHEMA],
                "displayName": "Fairlane-Admin",
                "members": [{"value": ada["id"]}],
            },
            status=201,
        ),
        resource_schema("Group"),
    )
    assert Membership.objects.get(scim_id=ada["id"]).role == Role.ADMIN
    scim(
        "patch",
        f"Groups/{group['id']}",
        {
            "schemas": [PATCH],
            "Operations": [{"op": "add", "path": "members", "value": [{"value": bob["id"]}]}],
        },
    )
    assert Membership.objects.get(scim_id=bob["id"]).role == Role.ADMIN
    listed = valid(scim("get", f"Groups/{group['id']}"), resource_schema("Group"))
    assert {m["value"] for m in listed["members"]} == {ada["id"], bob["id"]}
    assert (
        valid(scim("get", f"Users/{ada['id']}"), resource_schema("User"))["groups"][0]["value"]
        == group["id"]
    )
    scim(
        "patch",
        f"Groups/{group['id']}",
        {
            "schemas": [PATCH],
            "Operations": [{"op": "remove", "path": f'members[value eq "{ada["id"]}"]'}],
        },
    )
    assert Membership.objects.get(scim_id=ada["id"]).role == Role.VIEWER
    found = valid(scim("get", 'Groups?filter=displayName eq "Fairlane-Admin"'), LIST_RESPONSE)
    assert found["totalResults"] == 1
    scim("delete", f"Groups/{group['id']}", status=204)
    assert Membership.objects.get(scim_id=bob["id"]).role == Role.VIEWER
    assert last_record(action="scim_group.delete").tenant_id == tenant.pk


def test_a_token_sees_its_own_tenant_only(scim, tenant, other_tenant):
    user = new_user(scim)
    other = Scim(scim_token_create(tenant=other_tenant)[1])
    valid(other("get", f"Users/{user['id']}", status=404), ERROR)
    # An `or` in the filter never reaches past the token's tenant.
    found = other("get", 'Users?filter=userName eq "ada@acme.example" or userName pr')
    assert {r["userName"] for r in found["Resources"]} == {"oscar"}
    assert other("get", "Users")["totalResults"] == 1  # Globex's owner only
    other("delete", f"Users/{user['id']}", status=404)
    assert Membership.objects.filter(scim_id=user["id"]).exists()
    other("get", "Users/not-a-uuid", status=404)


def test_no_or_wrong_or_revoked_token_is_401(tenant):
    valid(Scim("")("get", "Users", status=401), ERROR)
    valid(Scim("scim-aaaaaaaaaaaa-" + "b" * 43)("get", "Users", status=401), ERROR)
    token, plain = scim_token_create(tenant=tenant)
    scim_token_revoke(tenant=tenant, token_id=token.pk)
    Scim(plain)("get", "Users", status=401)
    valid(Scim(plain)("get", "ServiceProviderConfig", status=401), ERROR)


def test_another_tenants_member_is_linked_but_never_edited(scim, tenant, other_tenant, other_owner):
    linked = new_user(scim, other_owner.username)
    other_owner.refresh_from_db()
    assert other_owner.first_name == ""  # the name SCIM sent is not written to their account
    assert Membership.objects.get(scim_id=linked["id"]).tenant == tenant


def test_the_service_provider_config_says_what_is_supported(scim):
    config = scim("get", "ServiceProviderConfig")
    assert config["patch"]["supported"] and not config["bulk"]["supported"]
    assert config["authenticationSchemes"][0]["type"] == "oauthbearertoken"
