"""Single sign-on against a real OpenID provider: django-oauth-toolkit in a Django process of
its own (tests/governance/oidc_provider), one per module, and Fairlane served by uvicorn on the
test database. The flows are driven over HTTP as a browser would (cookies, redirects, the
provider's sign-in form); test_sso_browser.py runs the same story in Chromium."""

import json
import re
import sys
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore

from tenants.models import Membership, OidcIdentity, Role
from tenants.services.tenancy import member_add, tenant_create, tenant_update
from tests.conftest import ROOT, child_env
from tests.servers import AsgiServer, Process, free_port

pytestmark = pytest.mark.django_db(transaction=True)
CLIENT_ID, CLIENT_SECRET = "fairlane-test", "provider-secret-for-tests-only"
PEOPLE = {
    "ada": {"email": "ada@acme.example", "groups": ["fl-acme-admins"]},
    "bob": {"email": "bob@acme.example"},
    "eve": {"email": "eve@elsewhere.example"},
    "olga": {"email": "olga@ops.example", "groups": ["platform-ops"]},
}
MAP = "domain:acme.example=acme:member; group:fl-acme-admins=acme:admin; group:platform-ops=ops"


class Provider(Process):
    def __init__(self, tmp: Path, port: int, redirect_uri: str) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        self.port, self.tamper_flag = port, tmp / "tamper"
        self.issuer = f"http://127.0.0.1:{port}/o"
        env = {
            **child_env(),
            "PROVIDER_DB": str(tmp / "provider.sqlite3"),
            "PROVIDER_RSA_KEY": pem,
            "PROVIDER_ISSUER": self.issuer,
            "PROVIDER_PORT": str(port),
            "PROVIDER_CLIENT_ID": CLIENT_ID,
            "PROVIDER_CLIENT_SECRET": CLIENT_SECRET,
            "PROVIDER_REDIRECT_URI": redirect_uri,
            "PROVIDER_PEOPLE": json.dumps(PEOPLE),
            "PROVIDER_TAMPER": str(self.tamper_flag),
        }
        super().__init__(
            [sys.executable, "-m", "tests.governance.oidc_provider.serve"],
            env,
            "oidc-provider",
            cwd=ROOT,
        )
        self.wait_for("provider ready", timeout=120)


@pytest.fixture(scope="module")
def idp(tmp_path_factory, django_db_setup, django_db_blocker):
    """(the provider, Fairlane's server) for the whole module."""
    port = free_port()
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_OIDC_PROVIDERS="testidp",
            FAIRLANE_OIDC_TESTIDP_NAME="Test IdP",
            FAIRLANE_OIDC_TESTIDP_ISSUER=f"http://127.0.0.1:{port}/o",
            FAIRLANE_OIDC_TESTIDP_CLIENT_ID=CLIENT_ID,
            FAIRLANE_OIDC_TESTIDP_CLIENT_SECRET=CLIENT_SECRET,
            FAIRLANE_OIDC_TESTIDP_SCOPES="openid email profile groups",
            FAIRLANE_OIDC_TESTIDP_MAP=MAP,
        )
    )
    provider = Provider(tmp_path_factory.mktemp("idp"), port, server.url + "/oidc/callback/")
    yield provider, server
    provider.stop()
    server.stop()


@pytest.fixture
def acme(make_user):
    return tenant_create(name="Acme", slug="acme", owner=make_user("olivia"))


def _provider_login(session: requests.Session, response, username: str, follow: bool = True):
    """Sign in at the provider's form, the way a person would."""
    assert "Test identity provider" in response.text, response.text[:500]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text).group(1)
    return session.post(
        response.url,
        data={
            "username": username,
            "password": f"pw-{username}",
            "csrfmiddlewaretoken": token,
            "next": re.search(r'name="next" value="([^"]*)"', response.text)
            .group(1)
            .replace("&amp;", "&"),
        },
        headers={"Referer": response.url},
        allow_redirects=follow,
    )


def sso(idp, username: str, *, before_callback=None) -> tuple[requests.Session, requests.Response]:
    provider, server = idp
    session = requests.Session()
    start = session.get(f"{server.url}/oidc/testidp/login/", allow_redirects=False)
    assert start.status_code == 302 and start.headers["Location"].startswith(provider.issuer)
    assert "code_challenge_method=S256" in start.headers["Location"]
    assert "nonce=" in start.headers["Location"]
    login_page = session.get(start.headers["Location"])
    if before_callback is None:
        return session, _provider_login(session, login_page, username)
    # stopped before the callback: the test changes something, then the browser goes on
    response = _provider_login(session, login_page, username, follow=False)
    location = response.headers["Location"]
    while "/oidc/callback/" not in location:
        location = session.get(
            requests.compat.urljoin(response.url, location), allow_redirects=False
        ).headers["Location"]
    before_callback(session)
    return session, session.get(location)


def test_sign_in_gives_the_tenant_and_role_the_claims_map_to(idp, acme):
    session, response = sso(idp, "ada")
    assert response.status_code == 200 and response.url.endswith("/portal/t/acme/"), response.url
    ada = get_user_model().objects.get(email="ada@acme.example")
    membership = Membership.objects.get(user=ada, tenant=acme)
    assert (membership.role, membership.source) == (Role.ADMIN, "sso")
    assert not ada.has_usable_password() and not ada.is_staff
    assert OidcIdentity.objects.get(user=ada).provider == "testidp"
    _, again = sso(idp, "bob")
    assert Membership.objects.get(user__email="bob@acme.example").role == Role.MEMBER
    assert again.url.endswith("/portal/t/acme/")


def test_someone_who_maps_to_nothing_is_refused_with_a_page_that_says_so(idp, acme):
    _, response = sso(idp, "eve")
    assert response.status_code == 403
    assert "maps to no tenant" in response.text
    assert not get_user_model().objects.filter(email="eve@elsewhere.example").exists()


def test_a_tampered_id_token_is_refused(idp, acme):
    provider, _ = idp
    provider.tamper_flag.write_text("on")
    try:
        session, response = sso(idp, "ada")
    finally:
        provider.tamper_flag.unlink()
    assert response.status_code == 403 and "could not be verified" in response.text
    assert not get_user_model().objects.filter(email__startswith="mallory").exists()
    assert session.get(f"{idp[1].url}/portal/t/acme/", allow_redirects=False).status_code == 302


def test_a_wrong_nonce_is_refused(idp, acme):
    def change_nonce(session):
        store = SessionStore(session.cookies["sessionid"])
        for state in store["oidc_states"].values():
            state["nonce"] = "not-the-nonce-the-provider-signed"
        store.save()

    session, response = sso(idp, "ada", before_callback=change_nonce)
    assert response.status_code == 403 and "could not be verified" in response.text
    assert not Membership.objects.filter(user__email="ada@acme.example").exists()


def test_sso_only_tenants_refuse_passwords_and_take_single_sign_on(idp, acme, make_user):
    _, server = idp
    carol = make_user("carol")
    member_add(tenant=acme, user=carol, role=Role.MEMBER, actor_role=Role.OWNER)
    tenant_update(tenant=acme, sso_only=True)
    session = requests.Session()
    page = session.get(f"{server.url}/portal/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    refused = session.post(
        f"{server.url}/portal/login/",
        data={"username": "carol", "password": "pw-carol", "csrfmiddlewaretoken": token},
        headers={"Referer": f"{server.url}/portal/login/"},
    )
    assert "single sign-on only" in refused.text and "Sign in with Test IdP" in refused.text
    sso_session, response = sso(idp, "ada")
    assert response.url.endswith("/portal/t/acme/") and response.status_code == 200
    assert sso_session.get(f"{server.url}/api/tenants/acme/").json()["sso_only"] is True


def test_operators_by_group_get_the_ops_dashboard_but_never_the_admin(idp, acme):
    session, _ = sso(idp, "olga")
    _, server = idp
    assert session.get(f"{server.url}/ops/").status_code == 200
    admin = session.get(f"{server.url}/admin/", allow_redirects=False)
    assert admin.status_code == 302 and "/admin/login/" in admin.headers["Location"]
