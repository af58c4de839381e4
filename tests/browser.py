"""Browser fixtures for every browser test (a pytest plugin of tests/conftest.py): Debian's
chromium, one Playwright per module."""

import os

import pytest

# pytest-playwright's sync API keeps its event loop "running" in this thread for as long as
# Playwright lives. Its fixtures are session-scoped; here they live for one module, so the
# loop is gone again before the next module's asyncio.run() or ORM calls.
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def playwright(_pw_api_request_contexts):
    """One Playwright for the module. While it lives its sync API keeps an event loop in this
    thread, so the test's own ORM calls between browser steps (plain blocking calls) are
    allowed for that time (DJANGO_ALLOW_ASYNC_UNSAFE), and no longer."""
    from playwright.sync_api import sync_playwright

    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    pw = sync_playwright().start()
    if _pw_api_request_contexts:
        _pw_api_request_contexts.instrument(pw)
    yield pw
    pw.stop()
    if saved is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


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
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
        ],
    }


@pytest.fixture(scope="module")
def browser_context_args():
    return {"viewport": {"width": 1280, "height": 860}}
