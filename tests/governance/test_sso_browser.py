"""Single sign-on in a real browser (Debian's Chromium through Playwright) against the real
OpenID provider process of test_sso.py (django-oauth-toolkit, its own sign-in page) and
Fairlane under uvicorn: a person signs in through the provider's page and lands in the tenant
and role their claims map to; someone who maps to nothing reads why; an SSO-only tenant
refuses a password and takes single sign-on."""

import pytest
from playwright.sync_api import Page, expect

from tenants.models import Membership, Role
from tenants.services.tenancy import member_add, tenant_update
from tests.governance.test_sso import acme, idp  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def sign_in_with_the_provider(page: Page, idp, username: str) -> None:  # noqa: F811
    """From Fairlane's sign-in page, through the provider's own page, and back."""
    provider, server = idp
    page.goto(server.url + "/portal/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    assert page.url.startswith(provider.issuer.removesuffix("/o") + "/login/")  # its own page
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in to the provider").click()


def main_nav(page: Page):
    return page.get_by_role("navigation", name="Main")


def test_a_person_signs_in_through_the_provider_into_the_tenant_and_role_of_their_claims(
    idp,  # noqa: F811
    acme,  # noqa: F811
    page: Page,
):
    _, server = idp
    sign_in_with_the_provider(page, idp, "ada")  # groups: fl-acme-admins -> acme admin
    expect(page).to_have_url(server.url + "/portal/t/acme/")
    expect(page.get_by_role("heading", name="Acme")).to_be_visible()
    expect(main_nav(page).get_by_role("link", name="Audit")).to_be_visible()  # admins only
    assert Membership.objects.get(user__email="ada@acme.example").role == Role.ADMIN

    page.context.clear_cookies()
    sign_in_with_the_provider(page, idp, "bob")  # only the domain: acme member
    expect(page).to_have_url(server.url + "/portal/t/acme/")
    expect(main_nav(page).get_by_role("link", name="Keys")).to_be_visible()
    expect(main_nav(page).get_by_role("link", name="Audit")).to_have_count(0)
    assert Membership.objects.get(user__email="bob@acme.example").role == Role.MEMBER


def test_someone_who_maps_to_nothing_reads_why(idp, acme, page: Page):  # noqa: F811
    sign_in_with_the_provider(page, idp, "eve")
    expect(page.get_by_role("heading", name="Not signed in")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("maps to no tenant")
    page.get_by_role("link", name="Back to sign-in").click()
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()


def test_an_sso_only_tenant_refuses_a_password_and_takes_single_sign_on(
    idp,  # noqa: F811
    acme,  # noqa: F811
    make_user,
    page: Page,
):
    _, server = idp
    carol = make_user("carol")
    member_add(tenant=acme, user=carol, role=Role.MEMBER, actor_role=Role.OWNER)
    tenant_update(tenant=acme, sso_only=True)

    page.goto(server.url + "/portal/login/")
    page.get_by_label("Username").fill("carol")
    page.get_by_label("Password").fill("pw-carol")
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_text("single sign-on only")).to_be_visible()
    page.goto(server.url + "/portal/t/acme/")
    expect(page).to_have_url(server.url + "/portal/login/?next=/portal/t/acme/")

    sign_in_with_the_provider(page, idp, "ada")
    expect(page).to_have_url(server.url + "/portal/t/acme/")
    expect(page.get_by_role("heading", name="Acme")).to_be_visible()
