"""Signing in and out, the throttle on failed sign-ins, password change and reset by email,
and the tenant switcher for people in several tenants."""

import re

from django.core import mail
from django.test import Client

from tenants.models import Role


def test_sign_in_lands_on_your_tenant_and_sign_out_ends_the_session(owner, tenant):
    client = Client()
    login = client.get("/portal/login/")
    assert login.status_code == 200 and b"csrfmiddlewaretoken" in login.content
    response = client.post(
        "/portal/login/", {"username": "olivia", "password": "pw-olivia"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/portal/t/acme/"
    assert b"Acme" in response.content
    assert client.post("/portal/logout/").status_code == 302
    assert client.get("/portal/t/acme/").status_code == 302  # back to sign-in


def test_repeated_failed_sign_ins_are_throttled_even_with_the_right_password(owner, settings):
    settings.FAIRLANE_LOGIN_MAX_FAILURES = 3
    client = Client()
    for _ in range(3):
        bad = client.post("/portal/login/", {"username": "olivia", "password": "wrong"})
        assert bad.status_code == 200 and b"correct username and password" in bad.content
    blocked = client.post("/portal/login/", {"username": "olivia", "password": "pw-olivia"})
    assert blocked.status_code == 429 and b"Too many failed sign-ins" in blocked.content
    assert "_auth_user_id" not in client.session
    # another username from elsewhere is not affected
    other = Client(REMOTE_ADDR="10.1.1.1")
    assert other.post("/portal/login/", {"username": "nobody", "password": "x"}).status_code == 200


def test_the_admin_sign_in_is_throttled_like_the_portals(make_user, settings):
    # Issue 28, finding 1: the admin took 12 wrong passwords, then the right one.
    settings.FAIRLANE_LOGIN_MAX_FAILURES = 3
    make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    assert b"csrfmiddlewaretoken" in client.get("/admin/login/").content
    for _ in range(3):
        bad = client.post("/admin/login/", {"username": "root", "password": "wrong"})
        assert bad.status_code == 200
    blocked = client.post("/admin/login/", {"username": "root", "password": "pw-root"})
    assert blocked.status_code == 429 and b"Too many failed sign-ins" in blocked.content
    assert "_auth_user_id" not in client.session
    assert client.get("/ops/").status_code == 302  # still signed out


def test_failures_count_across_the_portal_and_the_admin(make_user, settings):
    settings.FAIRLANE_LOGIN_MAX_FAILURES = 4
    make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    for path in ("/portal/login/", "/admin/login/", "/portal/login/", "/admin/login/"):
        assert client.post(path, {"username": "root", "password": "wrong"}).status_code == 200
    for path in ("/portal/login/", "/admin/login/"):
        assert client.post(path, {"username": "root", "password": "pw-root"}).status_code == 429


def test_the_address_limit_holds_across_usernames_and_forms(make_user, settings):
    settings.FAIRLANE_LOGIN_MAX_FAILURES = 1  # 4 failures from one address
    client = Client(REMOTE_ADDR="192.0.2.7")
    for i, path in enumerate(["/portal/login/", "/admin/login/"] * 2):
        assert client.post(path, {"username": f"u{i}", "password": "x"}).status_code == 200
    make_user("fresh")
    blocked = client.post("/portal/login/", {"username": "fresh", "password": "pw-fresh"})
    assert blocked.status_code == 429
    elsewhere = Client(REMOTE_ADDR="192.0.2.8")
    assert (
        elsewhere.post("/portal/login/", {"username": "fresh", "password": "pw-fresh"}).status_code
        == 302
    )


def test_password_reset_requests_are_throttled_and_send_nothing_then(make_user, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.FAIRLANE_LOGIN_MAX_FAILURES = 2
    make_user("rita", email="rita@example.com")
    client = Client()
    for _ in range(2):
        assert (
            client.post("/portal/password/reset/", {"email": "rita@example.com"}).status_code == 302
        )
    blocked = client.post("/portal/password/reset/", {"email": "rita@example.com"})
    assert blocked.status_code == 429 and b"Too many requests" in blocked.content
    assert len(mail.outbox) == 2


def test_password_change(owner):
    client = Client()
    client.force_login(owner)
    response = client.post(
        "/portal/password/change/",
        {
            "old_password": "pw-olivia",
            "new_password1": "a-Longer-pass-42",
            "new_password2": "a-Longer-pass-42",
        },
    )
    assert response.status_code == 302
    owner.refresh_from_db()
    assert owner.check_password("a-Longer-pass-42")


def test_password_reset_by_email(make_user, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    make_user("rita", email="rita@example.com")
    client = Client()
    assert client.post("/portal/password/reset/", {"email": "rita@example.com"}).status_code == 302
    assert (
        client.post("/portal/password/reset/", {"email": "nobody@example.com"}).status_code == 302
    )  # says nothing
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["rita@example.com"]
    link = re.search(r"http://testserver(/portal/password/reset/\S+/)", mail.outbox[0].body)[1]
    form = client.get(link, follow=True)
    assert b"Choose a new password" in form.content
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": "Fresh-pass-9876", "new_password2": "Fresh-pass-9876"},
    )
    assert done.status_code == 302
    assert Client().login(username="rita", password="Fresh-pass-9876")


def test_the_tenant_switcher_lists_every_tenant_of_a_person_in_several(
    tenant, other_tenant, member_of, make_user
):
    from tenants.services.tenancy import member_add

    user = member_of(tenant, Role.VIEWER, "sam")
    member_add(tenant=other_tenant, user=user, role=Role.MEMBER, actor_role=Role.OWNER)
    client = Client()
    client.force_login(user)
    home = client.get("/portal/")
    assert home.status_code == 200 and b"/portal/t/acme/" in home.content
    assert b"/portal/t/globex/" in home.content
    page = client.get("/portal/t/globex/").content.decode()
    assert 'id="tenant-switcher"' in page and 'value="/portal/t/acme/"' in page
    assert '<span class="role">member</span>' in page
    lonely = make_user("lonely")
    client.force_login(lonely)
    assert b"not a member of any tenant" in client.get("/portal/").content
