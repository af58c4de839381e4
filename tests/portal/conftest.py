"""Portal fixtures: people with each role in Acme, a signed-in Django test client for each,
and the failed-sign-in counters cleared (they live in the shared cache)."""

import pytest
from django.core.cache import cache
from django.test import Client

from tenants.models import Role


@pytest.fixture
def portal_client(member_of, tenant):
    """portal_client(role) -> (client signed in as a person with that role in Acme, user)."""
    def make(role: str = Role.ADMIN, *, csrf: bool = False, username: str | None = None):
        user = tenant.memberships.get(role=Role.OWNER).user if role == Role.OWNER else \
            member_of(tenant, role, username)
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client, user
    return make


@pytest.fixture(autouse=True)
def _login_counters_clear():
    from tenants.portal.throttle import PREFIX

    def clear():
        redis = getattr(cache, "_cache", None)
        if redis is not None and hasattr(redis, "get_client"):
            client = redis.get_client(None, write=True)
            keys = list(client.scan_iter(match=f"*{PREFIX}*"))
            if keys:
                client.delete(*keys)
        else:
            cache.clear()
    clear()
    yield
    clear()


# --- browser tests -------------------------------------------------------------------------
# pytest-playwright's sync API keeps its event loop "running" in this thread for as long as
# Playwright lives. Its fixtures are session-scoped; here they live for one module, so the
# loop is gone again before the next module's asyncio.run() or ORM calls.
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def playwright(_pw_api_request_contexts):
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    if _pw_api_request_contexts:
        _pw_api_request_contexts.instrument(pw)
    yield pw
    pw.stop()


@pytest.fixture(scope="module")
def browser_type(playwright, browser_name):
    return getattr(playwright, browser_name)


@pytest.fixture(scope="module")
def launch_browser(browser_type_launch_args, browser_type):
    def launch(**kwargs):
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})
    return launch


@pytest.fixture(scope="module")
def browser(launch_browser):
    browser = launch_browser()
    yield browser
    browser.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's chromium (Playwright's own browser download is not used)."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--no-first-run"]}


@pytest.fixture(scope="module")
def browser_context_args():
    return {"viewport": {"width": 1280, "height": 860}}
