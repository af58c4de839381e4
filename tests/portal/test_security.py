"""Headers and cookies: a Content-Security-Policy with no inline script (and no page that
needs one), X-Frame-Options DENY, HttpOnly SameSite=Lax session cookies, Secure under
SECURE_COOKIES."""

import re
import subprocess
import sys

import pytest
from django.test import Client
from django.urls import reverse

from tenants.models import Role
from tests.conftest import ROOT

PAGES = ["overview", "agents", "agent_create", "budgets", "keys", "usage", "members", "playground"]
SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
HANDLER = re.compile(r"<[^>]+\s(on[a-z]+)\s*=", re.I)
STYLE_ATTR = re.compile(r"<[^>]+\sstyle\s*=", re.I)


def _directives(header: str) -> dict:
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


def assert_no_inline_script(html: str, where: str) -> None:
    for attrs, body in SCRIPT.findall(html):
        if 'type="application/json"' in attrs:
            continue  # data for the page's scripts (json_script), never executed
        assert "src=" in attrs and not body.strip(), f"inline script in {where}"
    assert not HANDLER.search(html), f"inline event handler in {where}"
    assert not STYLE_ATTR.search(html), f"inline style attribute in {where}"


def test_every_page_has_a_strict_csp_and_needs_no_inline_script(portal_client, agent):
    client, _ = portal_client(Role.OWNER)
    urls = [reverse(f"portal:{name}", kwargs={"slug": "acme"}) for name in PAGES]
    urls += [
        reverse("portal:agent_routing", kwargs={"slug": "acme", "agent_id": agent.pk}),
        reverse("portal:agent_edit", kwargs={"slug": "acme", "agent_id": agent.pk}),
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        csp = _directives(response["Content-Security-Policy"])
        assert csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"]
        assert csp["frame-ancestors"] == ["'none'"] and csp["object-src"] == ["'none'"]
        assert response["X-Frame-Options"] == "DENY"
        assert_no_inline_script(response.content.decode(), url)
    created = client.post(
        reverse("portal:key_create", kwargs={"slug": "acme"}),
        {"agent": str(agent.pk), "scopes": ["inference"]},
    )
    assert_no_inline_script(created.content.decode(), "key created")
    for url in ["/portal/login/", "/portal/password/reset/"]:
        response = Client().get(url)
        assert "script-src 'self'" in response["Content-Security-Policy"]
        assert_no_inline_script(response.content.decode(), url)


def test_the_session_cookie_is_httponly_and_samesite_lax(owner):
    client = Client()
    response = client.post("/portal/login/", {"username": "olivia", "password": "pw-olivia"})
    assert response.status_code == 302
    cookie = response.cookies["sessionid"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and not cookie["secure"]
    assert response.cookies["csrftoken"]["samesite"] == "Lax"


def test_secure_cookies_setting_marks_session_and_csrf_cookies_secure():
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SESSION_COOKIE_HTTPONLY, "
        "s.SESSION_COOKIE_SAMESITE)"
    )
    env = {
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
        "SECURE_COOKIES": "true",
        "SECRET_KEY": "x" * 50,
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "Lax"]


def test_static_assets_are_served_from_the_app_not_a_cdn(portal_client):
    client, _ = portal_client(Role.VIEWER)
    html = client.get(reverse("portal:usage", kwargs={"slug": "acme"})).content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert sources and all(s.startswith("/static/") for s in sources), sources
    assert any("htmx" in s for s in sources) and any("chart.umd" in s for s in sources)


def _failed_sign_ins(url: str, forwarded: list[str], who: str) -> list[int]:
    """Failed sign-ins with a new username each, each claiming another X-Forwarded-For."""
    import httpx

    statuses = []
    with httpx.Client(base_url=url) as client:
        for i, address in enumerate(forwarded):
            page = client.get("/portal/login/").text
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
            statuses.append(
                client.post(
                    "/portal/login/",
                    data={"csrfmiddlewaretoken": token, "username": f"{who}{i}", "password": "x"},
                    headers={"X-Forwarded-For": address},
                ).status_code
            )
    return statuses


@pytest.mark.django_db(transaction=True)
def test_x_forwarded_for_is_trusted_only_from_configured_proxies():
    # Issue 28, finding 6: uvicorn trusted X-Forwarded-For from 127.0.0.1 by default, so a
    # client on the host rotated the address the sign-in throttle counts (limit 1 -> 4 per
    # address).
    from tests.conftest import child_env
    from tests.servers import AsgiServer

    forwarded = [f"198.51.100.{i}" for i in range(6)]
    server = AsgiServer(child_env(FAIRLANE_LOGIN_MAX_FAILURES="1"))
    try:
        assert _failed_sign_ins(server.url, forwarded, "guess") == [200] * 4 + [429] * 2
    finally:
        server.stop()
    trusting = AsgiServer(
        child_env(FAIRLANE_LOGIN_MAX_FAILURES="1", FORWARDED_ALLOW_IPS="127.0.0.1")
    )
    try:  # a configured proxy's header is believed: each address counts on its own
        assert (
            _failed_sign_ins(trusting.url, [f"203.0.113.{i}" for i in range(6)], "other")
            == [200] * 6
        )
    finally:
        trusting.stop()
